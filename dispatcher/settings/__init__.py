"""The dispatcher's settings, one module per concern (dispatcher.settings.deployment lists them),
and the only reader of the environment (dispatcher.settings.load)."""

from dispatcher.settings.callbacks import Callbacks
from dispatcher.settings.checks import CONFIG_FILE_VARIABLE, ENV_PREFIX
from dispatcher.settings.deployment import Settings
from dispatcher.settings.intake import Intake
from dispatcher.settings.limits import Limits
from dispatcher.settings.load import load_settings
from dispatcher.settings.operators import Operators
from dispatcher.settings.receiver import Receiver
from dispatcher.settings.retention import Retention
from dispatcher.settings.routes import ChannelKind, Route, Routing, Template
from dispatcher.settings.storage import Storage
from dispatcher.settings.timers import Timers
from dispatcher.settings.workspace_api import WorkspaceApi
from dispatcher.settings.workspaces import DEFAULT_WORKSPACE, Workspace

__all__ = [
    "CONFIG_FILE_VARIABLE", "DEFAULT_WORKSPACE", "ENV_PREFIX", "Callbacks", "ChannelKind", "Intake", "Limits",
    "Operators", "Receiver", "Retention", "Route", "Routing", "Settings", "Storage", "Template", "Timers",
    "Workspace", "WorkspaceApi", "load_settings",
]
