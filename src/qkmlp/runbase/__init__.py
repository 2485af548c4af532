"""The run base the pipelines share (``experiments``, ``pretrained``, ``pretrained.retrain``,
``bench``): provenance of every stored result and run record (:mod:`.provenance`) and the
statistics (:mod:`.stats`)."""
