"""The Python API given what is no net and no array: ``toolkit.Net`` of a dict nested 100,000
deep, or holding an ``object()``, or of a dict that refers to itself; ``Model.infer`` of a
string, an object or a ragged list. Each is a ``UserError`` or a ``TypeError`` that names the
argument and where in it, raised in a child process under an address-space limit within seconds
(never a RecursionError, PyYAML's RepresenterError or numpy's ValueError)."""
from __future__ import annotations

import pytest

from tests.bounded import run_python

MEMORY_MB = 1500
RAISED = '''
try:
    {call}
except Exception as e:
    print(type(e).__name__ + ": " + str(e))
else:
    print("no error")
'''


def raised(setup: str, call: str) -> str:
    """``Type: message`` of what ``call`` raises after ``setup``, in a bounded child process."""
    r = run_python("import toolkit\n" + setup + RAISED.format(call=call), memory_mb=MEMORY_MB, timeout=60)
    assert r.status == 0 and "Traceback" not in r.err, r.err
    assert r.seconds < 30
    return r.out.strip()


DEEP = '''
deep = {}
inner = deep
for _ in range(100_000):
    inner["a"] = {}
    inner = inner["a"]
'''


def test_a_dict_nested_100000_deep_is_one_user_error():
    said = raised(DEEP, 'toolkit.Net({"name": "x", "inputs": {}, "layers": [], "more": deep})')
    assert said.startswith("UserError: error: net: the dict is nested more than 100 levels deep "
                           "(at net['more']['a']['a']"), said
    assert len(said.splitlines()) == 1


def test_a_dict_that_holds_itself_is_one_user_error():
    said = raised('loop = {"name": "x"}\nloop["layers"] = [loop]\n', "toolkit.Net(loop)")
    assert said.startswith("UserError: error: net: the dict is nested more than 100 levels deep "
                           "(at net['layers'][0]['layers'][0]"), said


@pytest.mark.parametrize("where, value", [("net['layers'][0]['type']", "object()"),
                                          ("net['inputs']['data']['shape'][1]", "print")])
def test_a_dict_holding_what_no_net_file_can_is_a_type_error_naming_it(where, value):
    net = ('{"name": "x", "inputs": {"data": {"shape": ["N", 4]}}, '
           '"layers": [{"name": "fc", "type": "InnerProduct", "bottom": "data", "top": "fc", "num_output": 2}]}')
    path = where.removeprefix("net")
    said = raised(f"net = {net}\nnet{path} = {value}\n", "toolkit.Net(net)")
    kind = "object" if value == "object()" else "builtin_function_or_method"
    assert said == (f"TypeError: net: {where} is of type {kind}; a net dict holds only dicts, lists, strings, "
                    "numbers, booleans and None"), said


def test_numpy_scalars_in_a_dict_are_numbers():
    net = ('{"name": "x", "inputs": {"data": {"shape": ["N", np.int64(4)]}}, "layers": [{"name": "fc", '
           '"type": "InnerProduct", "bottom": "data", "top": "fc", "num_output": np.int32(2)}]}')
    said = raised("import numpy as np\n", f"net = toolkit.Net({net})\n"
                  '    print(net.spec.inputs["data"].shape, net.spec.layers[0].num_output)')
    assert said.splitlines()[0] == "['N', 4] 2", said


@pytest.mark.parametrize("value, said", [
    ("'abc'", "TypeError: infer: input 'data' is a str, not an array of numbers"),
    ("b'abc'", "TypeError: infer: input 'data' is a bytes, not an array of numbers"),
    ("object()", "TypeError: infer: input 'data' holds object values, not numbers"),
    ("[['a', 'b']]", "TypeError: infer: input 'data' holds <U1 values, not numbers"),
    ("[[1, 2], [3]]", "TypeError: infer: input 'data' is not an array of numbers (setting an array element with a "
                      "sequence."),
])
def test_infer_of_what_is_no_array_is_a_type_error_naming_the_input(value, said):
    got = raised('model = toolkit.load("zoo:lenet")\n', f"model.infer(data={value})")
    assert got.startswith(said) and len(got.splitlines()) == 1, got
