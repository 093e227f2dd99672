"""The node-wide refcounted cache of remote bytes, its budget and prewarming."""
