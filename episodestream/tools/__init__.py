"""Tooling around the datasets, none of it needed to train: synthetic datasets (``synthetic``),
Chrome traces (``tracing``), the command line (``cli``)."""
