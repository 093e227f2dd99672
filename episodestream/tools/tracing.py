"""Chrome-trace events of the pipeline (admit, evict, decode, build), readable by Perfetto: turn
them on, name a process, read a trace back. The call sites and the tracer live in
``episodestream._base.tracing``, below every layer that emits events."""

from episodestream._base.tracing import TraceLevel, disable_tracer, enable_tracer, load_trace, set_process_name, tracer_enabled

__all__ = ["TraceLevel", "disable_tracer", "enable_tracer", "load_trace", "set_process_name", "tracer_enabled"]
