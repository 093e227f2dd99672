"""Video decoding: backends behind one interface, a per-consumer decoder cache, grouped queries."""
