"""An ``EpisodeMixture``'s runtime: its schema and renames, its metadata and exact stats, and its consumers' interleaved passes."""
