"""The toolkit's version, on the ground floor: the server and the zoo's model cards name it
without importing the package's face (``toolkit/__init__``, which hands out the whole API)."""
__version__ = "0.1.0"
