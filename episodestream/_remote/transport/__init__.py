"""Moving bytes: ranged reads and block cache, downloads, the adaptive controller, node-wide permits,
failure classification and retries. Imports only ``_base``."""
