"""A declarative deep-learning toolkit: Caffe-style YAML nets compiled to optimised dataflow graphs."""
__version__ = "0.1.0"
