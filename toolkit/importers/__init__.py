"""Models from other toolkits, imported as net files and weights files: ``caffe/`` (prototxt,
caffemodel and solver files)."""
