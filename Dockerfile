# notification-dispatcher: one image for every process (worker, consumer, beat, receiver,
# flower, migrations, sandbox). The entrypoint is the `dispatcher` CLI; the command picks the
# process, e.g. `docker run IMAGE worker --concurrency 4`. See docs/operations.md.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# Only what the package build needs: no tests, no local state, no .env (see .dockerignore).
COPY pyproject.toml README.md ./
COPY dispatcher ./dispatcher
COPY workers ./workers
COPY sandbox ./sandbox
RUN pip install ".[tracing]" && rm -rf /src

# A non-root user; its home is the working directory, so beat's schedule file is writable.
RUN groupadd --system --gid 10001 dispatcher \
    && useradd --system --uid 10001 --gid dispatcher --create-home --home-dir /home/dispatcher dispatcher
USER dispatcher:dispatcher
WORKDIR /home/dispatcher

ENTRYPOINT ["dispatcher"]
CMD ["--help"]
