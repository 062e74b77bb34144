# Sourced by scripts/demo and scripts/test: make .venv and install the project into it.
# Re-installs only when pyproject.toml changed, so a second run starts at once.
ensure_venv() {
  local extras="$1"
  local stamp=".venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)${extras}"
  if [ ! -x .venv/bin/python ]; then
    echo "setting up .venv (first run: about a minute)" >&2
    python3 -m venv .venv
  fi
  if [ ! -f "$stamp" ]; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".${extras}" 2>&1 \
      | grep -v "is ignored: it is neither a file nor a directory" >&2 || true
    .venv/bin/python -c "import dispatcher" || { echo "install failed" >&2; exit 1; }
    rm -f .venv/.installed-*
    touch "$stamp"
  fi
}
