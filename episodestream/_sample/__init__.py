"""Building samples: the ``SampleBuilder`` (rows -> values, windows, masks, video queries), the
lifetime of held episodes, frame writing (HWC -> CHW) and video decoding. Imports ``_format`` and ``_base``."""
