"""Foundation: option validation, errors, warnings blamed on the user's line, where this process
stands (rank, worker), cache paths and the tracer. Imports nothing else of episodestream's."""
