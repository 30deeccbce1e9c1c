"""Post-training quantization's numbers: the ranges calibration finds for a net's tensors
(``calibrate.py``'s observers, ``collect.py`` running the net over calibration data) and the
scale and zero point of each range (``scales.py``)."""
