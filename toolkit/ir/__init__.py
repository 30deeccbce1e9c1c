"""Graph IR: symbolic dimensions, tensor types, values, nodes, graphs, binding symbols to sizes.
It knows no op: the op table, and the verifier that checks nodes against it, are ops/'s."""
from .dims import Dim, DimError, Sym, as_dim, evaluate, format_dim, product
from .graph import ALL_DTYPES, FLOAT_DTYPES, Graph, Node, TensorType, Value, Weight

__all__ = ["Dim", "DimError", "Sym", "as_dim", "evaluate", "format_dim", "product", "ALL_DTYPES",
           "FLOAT_DTYPES", "Graph", "Node", "TensorType", "Value", "Weight"]
