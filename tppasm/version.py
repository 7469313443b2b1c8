"""tppasm's version (read by setup.cfg, and part of every disk-cache key)."""
__version__ = "0.1.0"
