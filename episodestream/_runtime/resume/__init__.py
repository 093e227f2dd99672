"""Resume across processes: the shared epoch, a process's own position, how states are checked and applied, and a StatefulDataLoader's state read back."""
