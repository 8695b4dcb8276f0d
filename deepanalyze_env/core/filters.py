"""Record filters for ``rollout --keep``: a small, safe Python-expression subset over one record.

Users write what they would write in Python (``reward_status == "scored" and reward >= 0.5``,
``reward_components["qa_accuracy"] == 1``, ``method == "qa" and turns <= 6``), but the
expression is checked against a whitelist of syntax when the command starts — no calls except
a few pure built-ins, no attribute access, no dunder tricks — because a filter runs on every
episode of a long run and a typo must fail before the first one, not after the last.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable

from deepanalyze_env.core.contracts import JsonObject
from deepanalyze_env.core.records import RECORD_FIELDS

# Names a filter can use besides the record's own fields.
DERIVED = {
    "method": lambda r: (r.get("reward_spec") or {}).get("method"),
    "code_pass_rate": lambda r: (sum(r["code_pass"]) / len(r["code_pass"])) if r.get("code_pass") else None,
}
FUNCTIONS: dict[str, Callable[..., object]] = {
    "len": len,
    "min": min,
    "max": max,
    "abs": abs,
    "sum": sum,
    "round": round,
}
_COMPARE = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}
_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Mod: operator.mod,
}
_UNARY = {ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos}


class FilterError(ValueError):
    """The expression is not a valid record filter; the message says why."""


class RecordFilter:
    """``RecordFilter(expr)(record) -> bool``; raises :class:`FilterError` for a bad expression."""

    def __init__(self, expression: str):
        self.expression = expression
        try:
            tree = ast.parse(expression.strip(), mode="eval")
        except SyntaxError as exc:
            raise FilterError(f"{expression!r} is not a valid expression: {exc.msg}")
        self._check(tree.body)
        self._tree = tree.body

    def __call__(self, record: JsonObject) -> bool:
        try:
            return bool(self._eval(self._tree, record))
        except (TypeError, KeyError, IndexError, ZeroDivisionError):
            return False  # e.g. a component this episode does not have, or reward None < 0.5

    # ------------------------------------------------------------------ checking

    def _check(self, node: ast.AST) -> None:
        if isinstance(node, ast.BoolOp | ast.Compare | ast.BinOp | ast.UnaryOp | ast.IfExp):
            if isinstance(node, ast.BinOp) and type(node.op) not in _BINARY:
                raise FilterError(f"operator {type(node.op).__name__} is not allowed in a filter")
            if isinstance(node, ast.UnaryOp) and type(node.op) not in _UNARY:
                raise FilterError(f"operator {type(node.op).__name__} is not allowed in a filter")
        elif isinstance(node, ast.Name):
            if node.id not in RECORD_FIELDS and node.id not in DERIVED and node.id not in FUNCTIONS:
                known = ", ".join([*RECORD_FIELDS, *DERIVED])
                raise FilterError(f"unknown name {node.id!r} in the filter; record fields: {known}")
        elif isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS or node.keywords:
                raise FilterError(f"only {', '.join(FUNCTIONS)} may be called in a filter")
        elif not isinstance(
            node,
            ast.Constant
            | ast.Subscript
            | ast.List
            | ast.Tuple
            | ast.Set
            | ast.Load
            | ast.boolop
            | ast.cmpop
            | ast.operator
            | ast.unaryop,
        ):
            raise FilterError(f"{type(node).__name__} is not allowed in a filter")
        for child in ast.iter_child_nodes(node):
            self._check(child)

    # ------------------------------------------------------------------ evaluation

    def _eval(self, node: ast.AST, record: JsonObject) -> object:
        """The value of a checked expression over one record: a JSON value, a number computed
        from them, or (a called name) one of :data:`FUNCTIONS`."""
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in DERIVED:
                return DERIVED[node.id](record)
            if node.id in FUNCTIONS:
                return FUNCTIONS[node.id]
            return record.get(node.id)
        if isinstance(node, ast.BoolOp):
            if isinstance(node.op, ast.And):
                return all(self._eval(v, record) for v in node.values)
            return any(self._eval(v, record) for v in node.values)
        if isinstance(node, ast.Compare):
            left = self._eval(node.left, record)
            for op, comparator in zip(node.ops, node.comparators, strict=True):
                right = self._eval(comparator, record)
                if not _COMPARE[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.BinOp):
            return _BINARY[type(node.op)](self._eval(node.left, record), self._eval(node.right, record))
        if isinstance(node, ast.UnaryOp):
            return _UNARY[type(node.op)](self._eval(node.operand, record))
        if isinstance(node, ast.IfExp):
            branch = node.body if self._eval(node.test, record) else node.orelse
            return self._eval(branch, record)
        if isinstance(node, ast.Subscript):
            return self._eval(node.value, record)[self._eval(node.slice, record)]
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            return [self._eval(e, record) for e in node.elts]
        if isinstance(node, ast.Call):
            fn = self._eval(node.func, record)
            return fn(*(self._eval(a, record) for a in node.args))
        raise FilterError(f"{type(node).__name__} is not allowed in a filter")  # unreachable after _check
