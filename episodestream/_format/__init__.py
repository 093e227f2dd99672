"""The LeRobot on-disk format: dataset files and paths, metadata, the episode table, stats,
LeRobot-shaped ``meta``, episode rows (parquet and the column cache). Imports only ``_base``."""
