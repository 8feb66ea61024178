"""Bad tensor expressions fail at definition time with typed errors that say what to fix, never with a crash."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.base import dtypes
from compiler.base.errors import InvalidExpr, TilefarmError, UnsupportedDType
from compiler.tensor import te
from compiler.tensor.dag import ComputeDAG

X = te.placeholder((4, 5), name="x")
K = te.reduce_axis(5, "k")


# ---------------------------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize("dtype", ["float16", "complex64", "foo", np.float16, np.complex64, None, 5])
def test_unsupported_dtype_lists_the_supported_ones(dtype):
    with pytest.raises(UnsupportedDType) as err:
        te.placeholder((4,), dtype)
    message = str(err.value)
    assert "is not supported" in message
    assert all(name in message for name in dtypes.DTYPES)


def test_unsupported_dtype_is_named_in_the_message():
    with pytest.raises(UnsupportedDType, match="'float16'"):
        te.placeholder((4,), "float16")
    with pytest.raises(UnsupportedDType, match="'complex64'"):
        te.placeholder((4,), np.complex64)


@pytest.mark.parametrize(
    "make",
    [lambda: te.const(1, "float16"), lambda: te.cast("bfloat16", X[0, 0]), lambda: te.min_value("complex64")],
    ids=["const", "cast", "min_value"],
)
def test_unsupported_dtype_anywhere_in_an_expression(make):
    with pytest.raises(UnsupportedDType):
        make()


def test_numpy_dtype_objects_are_accepted():
    assert te.placeholder((4,), np.float32).dtype == "float32"
    assert te.placeholder((4,), np.dtype("int8")).dtype == "int8"


# ---------------------------------------------------------------------------------------------- reductions


@pytest.mark.parametrize("axis", [[], ()], ids=["list", "tuple"])
def test_reduction_without_an_axis(axis):
    with pytest.raises(InvalidExpr, match="te.sum: a reduction needs at least one reduce axis"):
        te.sum(X[0, 0], axis=axis)


@pytest.mark.parametrize("axis", ["k", None, [K, None]], ids=repr)
def test_reduction_over_something_that_is_not_a_reduce_axis(axis):
    with pytest.raises(InvalidExpr, match="te.reduce_axis"):
        te.max(X[0, 0], axis=axis)


def test_reduction_over_a_plain_variable():
    # a compute axis has no extent of its own: it cannot be reduced over
    with pytest.raises(InvalidExpr, match="reduce axes must be made with te.reduce_axis"):
        te.compute((4,), lambda i: te.sum(X[i, 0], axis=te.Var("j")))


@pytest.mark.parametrize(
    "extent, words",
    [
        (0, "must be positive, got 0"),
        (-3, "must be positive"),
        ((0, 0), "must be positive"),
        ((1, 4), "only (0, n) ranges"),
        ((0,), "only (0, n) ranges"),
        (2.5, "must be an integer, got 2.5"),
        ("5", "must be an integer"),
        (None, "must be an integer"),
    ],
    ids=repr,
)
def test_bad_reduce_axis(extent, words):
    with pytest.raises(InvalidExpr) as err:
        te.reduce_axis(extent, "r")
    assert err.value.args[0].startswith("reduce axis r:")
    assert words in str(err.value)


def test_reduce_axis_accepts_numpy_integers_and_tvm_ranges():
    assert te.reduce_axis(np.int64(3)).extent == 3
    assert te.reduce_axis((0, 7)).extent == 7


@pytest.mark.parametrize(
    "body",
    [
        lambda i: te.sum(X[i, K], axis=K) + 1.0,
        lambda i: te.exp(te.sum(X[i, K], axis=K)),
        lambda i: te.sum(te.max(X[i, K], axis=K), axis=te.reduce_axis(2, "r")),
        lambda i: te.select(X[i, 0] > 0, te.sum(X[i, K], axis=K), 0.0),
    ],
    ids=["plus", "exp", "nested", "select"],
)
def test_reduction_nested_inside_an_expression(body):
    with pytest.raises(InvalidExpr, match="compute y: a reduction must be the whole body"):
        te.compute((4,), body, name="y")


def test_reduce_axis_listed_twice():
    with pytest.raises(InvalidExpr, match="listed twice"):
        te.compute((4,), lambda i: te.sum(X[i, K], axis=[K, K]), name="y")


def test_reduce_axis_named_like_an_output_axis():
    with pytest.raises(InvalidExpr, match=r"reduce axis names \['k'\] clash with the output axes"):
        te.compute((5,), lambda k: te.sum(X[0, K], axis=K), name="y")


@pytest.mark.parametrize(
    "body",
    [
        lambda i: X[i, K],  # a reduce axis without its reduction
        lambda i: te.sum(X[i, K], axis=te.reduce_axis(5, "j")),  # reduced over j, indexed by k
        lambda i: te.sum(X[i, K], axis=te.reduce_axis(3, "k")),  # another axis with the same name
    ],
    ids=["no reduction", "other axis", "same name"],
)
def test_stray_index_variable(body):
    # each of these used to lower to loops reading an unbound or wrong variable
    with pytest.raises(InvalidExpr, match=r"uses index variables \['k'\] that are neither its axes"):
        te.compute((4,), body, name="y")


# ---------------------------------------------------------------------------------------------- compute and indexing


@pytest.mark.parametrize(
    "shape, fn, got",
    [
        ((4, 5), lambda i: X[i, 0], "takes 1 indices but the shape has 2"),
        ((4,), lambda i, j: X[i, j], "takes 2 indices but the shape has 1"),
        ((4,), lambda: X[0, 0], "takes 0 indices but the shape has 1"),
        ((4,), lambda i, j=0: X[i, j], "takes 2 indices but the shape has 1"),
    ],
    ids=["too few", "too many", "none", "default"],
)
def test_compute_with_mismatched_lambda_arity(shape, fn, got):
    with pytest.raises(InvalidExpr, match=f"compute y: the function {got}"):
        te.compute(shape, fn, name="y")


def test_compute_with_varargs_names_axes_by_position():
    y = te.compute((4, 5), lambda *i: X[i] * 2.0, name="y")
    assert [a.name for a in y.op.axes] == ["i0", "i1"]


def test_compute_with_something_not_callable():
    with pytest.raises(InvalidExpr, match="expected a function"):
        te.compute((4,), 5, name="y")


@pytest.mark.parametrize("index", [(0,), (0, 1, 2), 1], ids=repr)
def test_indexing_with_the_wrong_number_of_indices(index):
    with pytest.raises(InvalidExpr, match="tensor x has 2 dims but was indexed with"):
        X[index]


def test_indexing_with_a_float():
    with pytest.raises(InvalidExpr, match="indices must be integers"):
        te.compute((4,), lambda i: X[i, 1.5], name="y")
    with pytest.raises(InvalidExpr, match="indices must be integers"):
        te.compute((4,), lambda i: X[i, X[i, 0]], name="y")  # a float32 value used as an index


@pytest.mark.parametrize(
    "body",
    [
        lambda i: X[i, 0] if X[i, 0] > 0 else 0.0,
        lambda i: X[i, 0] if i > 0 else 0.0,
        lambda i: X[i, 0] and X[i, 1],
        lambda i: max(X[i, 0], X[i, 1]),  # the builtin, not te.maximum
    ],
    ids=["if on a value", "if on an index", "and", "builtin max"],
)
def test_python_control_flow_on_an_expression(body):
    with pytest.raises(InvalidExpr, match="unknown at definition time; use te.select"):
        te.compute((4,), body, name="y")


def test_select_on_a_python_bool_from_equality():
    # `i == 0` is structural equality (False here), so the select would silently always take the else branch
    with pytest.raises(InvalidExpr, match="te.equal"):
        te.compute((4,), lambda i: te.select(i == 0, X[i, 0], 0.0), name="y")
    y = te.compute((4,), lambda i: te.select(te.equal(i, 0), X[i, 0], 0.0), name="y")
    assert isinstance(y.op.body, te.Select)


@pytest.mark.parametrize(
    "body, words",
    [
        (lambda i: None, "cannot use None"),
        (lambda i: X[i, 0] + "a", "cannot use 'a'"),
        (lambda i: X, "cannot use Tensor(x"),
        (lambda i: te.exp(i), "te.exp needs a float argument"),
        (lambda i: te.select(X[i, 0] > 0, X[i, 0], te.const(1, "int32")), "different dtypes"),
    ],
    ids=["None", "str", "tensor", "exp of int", "select dtypes"],
)
def test_values_that_are_not_expressions(body, words):
    with pytest.raises(InvalidExpr, match=words.replace("(", r"\(")):
        te.compute((4,), body, name="y")


# ---------------------------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("shape", [(0, 4), (-1, 4), (4, 0)], ids=repr)
def test_non_positive_shapes(shape):
    with pytest.raises(InvalidExpr, match=r"every dimension must be positive, got \["):
        te.placeholder(shape, name="p")
    with pytest.raises(InvalidExpr, match="tensor c: every dimension must be positive"):
        te.compute(shape, lambda i, j: i + j, name="c")


@pytest.mark.parametrize("shape", [(2.5, 4), ("a", 4), None, 4], ids=repr)
def test_shapes_that_are_not_integer_sequences(shape):
    with pytest.raises(InvalidExpr, match="must be a sequence of integers"):
        te.placeholder(shape, name="p")


def test_shape_accepts_numpy_integers():
    assert te.placeholder((np.int64(3), 4)).shape == (3, 4)


# ---------------------------------------------------------------------------------------------- DAGs


def test_dag_without_outputs():
    with pytest.raises(InvalidExpr, match="at least one computed output"):
        ComputeDAG([X])


def test_dag_with_an_unused_input():
    other = te.placeholder((3,), name="other")
    with pytest.raises(InvalidExpr, match=r"inputs \['other'\] are not read by any output"):
        ComputeDAG([X, other, te.compute((4,), lambda i: X[i, 0], "y")])


def test_dag_reading_two_tensors_with_one_name():
    a, b = te.placeholder((4,), name="t"), te.placeholder((4,), name="t")
    with pytest.raises(InvalidExpr, match="two different tensors with the same name"):
        ComputeDAG([te.compute((4,), lambda i: a[i] + b[i], "y")])


def test_every_error_is_a_tilefarm_error():
    # callers catch TilefarmError to tell bad input from bugs
    assert issubclass(InvalidExpr, TilefarmError) and issubclass(UnsupportedDType, TilefarmError)
