"""Configuration: the daemon's TOML file and its priority classes, read and checked
once at start-up (and on reload); an error names the key and the fix.
"""

from edged.config.classes import ClassConfig, default_classes
from edged.config.file import (
    Config,
    MetricsConfig,
    SecurityConfig,
    default_endpoint,
    default_repository,
    load_config,
    parse_config,
)
from edged.config.settings import ConfigError

__all__ = [
    "ClassConfig",
    "Config",
    "ConfigError",
    "MetricsConfig",
    "SecurityConfig",
    "default_classes",
    "default_endpoint",
    "default_repository",
    "load_config",
    "parse_config",
]
