"""What a ``%%kcoral`` cell's returned tensors become in the kernel, in a real kernel
(nbclient) against a real CPU server that asks for a token, as the README starts one:

* a torch tensor inside a returned dict or list comes back as torch, as one returned alone
  does (they came back as NumPy arrays: ``{'loss': t, 'grads': [g1, g2]}`` was half torch);
  NumPy arrays beside them stay NumPy;
* with torch ``-i`` tensors every tensor comes back as torch, those inside a dict or list
  too (a NumPy array the cell made stayed NumPy there);
* a complex tensor, which the protocol does not carry, is shown as the server's text with a
  line saying that the value did not come back, why, and what to return instead (the text
  alone read as if the value had come back, and ``_`` held the cell before).
"""

from __future__ import annotations

from typing import Any

import pytest
from notebook_cells import executed_on_a_token_server, shown

pytest.importorskip("torch", reason="the kernel's torch values need torch")
pytestmark = pytest.mark.timeout(300)


#: A cell whose final value holds torch tensors inside a dict and a list, and a NumPy array.
NESTED_CELL = """%%kcoral
import numpy, torch
t, g1, g2 = torch.ones(2), torch.zeros(3), torch.arange(4)
{"loss": t, "grads": [g1, g2], "plain": numpy.ones(2), "step": 3}"""

NESTED_TYPES_CELL = """[type(v).__module__.split(".")[0] for v in
 (_["loss"], _["grads"][0], _["grads"][1], _["plain"])] + [_["step"]]"""

#: An -o value holding torch inside a list (a tuple on the server).
NESTED_OUTPUT_CELL = """%%kcoral -o pair
import torch
pair = (torch.ones(1), {"inner": torch.zeros(1)})"""

NESTED_OUTPUT_TYPES_CELL = """[type(pair[0]).__module__, type(pair[1]["inner"]).__module__]"""

#: torch in, torch out: NumPy arrays the cell made inside a list come back as torch too.
TORCH_INPUT_CELLS = [
    "import torch\nx = torch.ones(1)",
    "%%kcoral -i x\nimport numpy\n{'made': [numpy.ones(1)], 'x': x}",
    "[type(v).__module__ for v in (_['made'][0], _['x'])]",
]

COMPLEX_CELL = """%%kcoral
import torch
torch.tensor([1 + 2j, 3 - 1j])"""


@pytest.fixture(scope="module")
def notebook(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return executed_on_a_token_server(
        [
            NESTED_CELL,
            NESTED_TYPES_CELL,
            NESTED_OUTPUT_CELL,
            NESTED_OUTPUT_TYPES_CELL,
            COMPLEX_CELL,
            *TORCH_INPUT_CELLS,
        ],
        tmp_path_factory,
    )


def test_torch_tensors_inside_a_returned_dict_and_list_come_back_as_torch(notebook) -> None:
    assert shown(notebook.cells[3]) == "['torch', 'torch', 'torch', 'numpy', 3]"


def test_torch_tensors_inside_an_out_value_come_back_as_torch(notebook) -> None:
    assert shown(notebook.cells[5]) == "['torch', 'torch']"


def test_a_complex_tensor_says_it_did_not_come_back_and_what_to_return(notebook) -> None:
    text = shown(notebook.cells[6])
    assert "\ntensor([1.+2.j, 3.-1.j])\n" in text, text
    assert text.endswith(
        "\nThe value did not come back: a torch complex64 tensor is not a type the protocol "
        "carries (above is the server's text of it); return torch.view_as_real(t) and "
        "torch.view_as_complex it here."
    ), text


def test_with_torch_inputs_arrays_made_inside_a_list_come_back_as_torch(notebook) -> None:
    assert shown(notebook.cells[9]) == "['torch', 'torch']"
