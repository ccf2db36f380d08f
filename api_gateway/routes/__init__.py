"""Route modules: ``public`` (/v1), ``admin`` (/admin), ``internal`` (the runtime shim), ``health``."""
