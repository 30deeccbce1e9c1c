"""Arrays read from files, for weights, training data and ``toolkit infer``: .npy and .npz
(pickles refused), numeric CSV tables and images, whole or a range of rows at a time, with one
set of checks and error messages."""
from .files import check_file, list_folder, unsupported_format
from .images import IMAGE_SUFFIXES, ImageRows, decode_image, image_files, image_layout, read_image
from .npy import load_npy, load_npz, open_npy, open_npz
from .rows import Rows
from .table import CsvRows

__all__ = ["IMAGE_SUFFIXES", "CsvRows", "ImageRows", "Rows", "check_file", "decode_image", "image_files",
           "image_layout", "list_folder", "load_npy", "load_npz", "open_npy", "open_npz", "read_image",
           "unsupported_format"]
