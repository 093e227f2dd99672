"""Remote sources: ``transport`` (ranged reads, downloads, the controller, retries), ``cache`` (the
node-wide refcounted cache and prewarming) and ``source`` (resolving a URL or repo id, the
``DatasetFiles`` / ``EpisodeVideos`` seams for remote data). transport <- cache <- source."""
