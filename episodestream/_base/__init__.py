"""Foundation: option validation, errors, where this process stands (rank, worker), cache paths and
the tracer. Imports nothing else of episodestream's."""
