"""Running streams: the shared dataset core, the stream seam between sources and loaders, the decode
pipeline, shared epochs, batch memory, a mixture's stream and meta. Imports every lower layer."""
