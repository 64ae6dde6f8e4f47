"""Kubernetes' own syntax for the strings an RLJob hands to Kubernetes: object names,
label keys and values, quantities, image references, environment variable names.

Each check exists twice on purpose, once for each validator: as schema (a `format`
or `pattern` the API server applies) or CEL (a snippet for a `CelRule`), and as
Python for pydantic. The Python side follows the Kubernetes code it mirrors
(apimachinery's validation and resource.ParseQuantity, the distribution/reference
grammar); the tests in tests/api hold the two sides to the same verdict.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Annotated, Any, Final

from celpy import celtypes
from pydantic import Field, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

# --- names (OpenAPI formats the API server knows since Kubernetes 1.34) ---------------------------

_DNS_LABEL: Final = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"


@dataclass(frozen=True)
class KubeString:
    """A string syntax of Kubernetes, used as `Annotated[str, SYNTAX]`: the CRD gets the
    `format` (one the API server knows) or else a CEL rule matching the regex, whose message
    says what is expected (a `pattern` error would quote the regex). Pydantic checks the same
    regex and length. The reference describes it with `what` instead of the regex."""

    what: str
    regex: str
    max_length: int
    format: str | None = None

    def check(self, value: str) -> str:
        # fullmatch: in Python `$` also matches before a final newline, in RE2 (the server's) not.
        if len(value) > self.max_length or not re.fullmatch(self.regex, value):
            raise PydanticCustomError("syntax", "must be {what}", {"what": self.what})
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        out = handler(schema)
        if self.format:
            out["format"] = self.format
        else:
            rule = {"rule": f"self.matches(r'{self.regex}')", "message": f"must be {self.what}"}
            out["x-kubernetes-validations"] = [rule]
        return out

    def describe(self) -> str:
        return f"format `{self.format}`: {self.what}" if self.format else f"must be {self.what}"


# An object name such as a ConfigMap's, a Secret's or a ServiceAccount's (kube-openapi's
# strfmt/kubernetes-extensions.go: a DNS-1123 subdomain without the 63-character label bound).
LONG_NAME: Final = KubeString(
    "a DNS-1123 subdomain (lower-case a-z, 0-9, '-', '.', starting and ending alphanumeric)",
    rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*$",
    253,
    "k8s-long-name",
)
# A DNS-1123 label: volume names.
SHORT_NAME: Final = KubeString(
    "a DNS-1123 label (lower-case a-z, 0-9, '-', starting and ending alphanumeric)",
    f"^{_DNS_LABEL}$",
    63,
    "k8s-short-name",
)

# --- labels ---------------------------------------------------------------------------------------

# A label value: at most 63 characters, alphanumeric at both ends, '-', '_', '.' inside; may be empty.
LABEL_VALUE_PATTERN: Final = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LABEL_VALUE_MAX: Final = 63
# A label key (qualified name): an optional DNS-subdomain prefix of at most 253 characters and '/',
# then a name of at most 63 characters. The name's bound is inside the regex; the prefix's is a
# second regex, since RE2 has no look-ahead.
# `[.]`, not `\.`: the pattern sits in a CEL string literal, where `\.` is no valid escape.
LABEL_KEY_PATTERN: Final = rf"^({_DNS_LABEL}([.]{_DNS_LABEL})*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9])?$"
LABEL_KEY_PREFIX_TOO_LONG: Final = "^[^/]{254,}/"
LABEL_KEY_MAX: Final = 253 + 1 + 63
# An annotation key: the same, but ValidateAnnotations lower-cases the key before the check, so
# the prefix may hold upper-case letters too.
_DNS_LABEL_ANY_CASE: Final = "[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?"
ANNOTATION_KEY_PATTERN: Final = (
    rf"^({_DNS_LABEL_ANY_CASE}([.]{_DNS_LABEL_ANY_CASE})*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9])?$"
)
QUALIFIED_NAME_WHAT: Final = (
    "an optional DNS subdomain and '/', then at most 63 characters: alphanumeric at both ends, '-', '_', '.' inside"
)


def cel_is_label_key(expr: str) -> str:
    """CEL that holds when the string `expr` is a label key (Kubernetes' IsQualifiedName)."""
    return f"({expr}.matches('{LABEL_KEY_PATTERN}') && !{expr}.matches('{LABEL_KEY_PREFIX_TOO_LONG}'))"


def cel_is_annotation_key(expr: str) -> str:
    """CEL that holds when the string `expr` is an annotation key (IsQualifiedName of its lower case)."""
    return f"({expr}.matches('{ANNOTATION_KEY_PATTERN}') && !{expr}.matches('{LABEL_KEY_PREFIX_TOO_LONG}'))"


# A label value, as a field's type (maps of them: nodeSelector, pod labels).
LabelValue = Annotated[str, Field(max_length=LABEL_VALUE_MAX, pattern=LABEL_VALUE_PATTERN)]
# A qualified name as a field of its own (a scheduling gate's name).
QUALIFIED_NAME: Final = KubeString(
    "a qualified name: " + QUALIFIED_NAME_WHAT,
    LABEL_KEY_PATTERN,
    LABEL_KEY_MAX,
)


# --- environment variables ------------------------------------------------------------------------

# Kubernetes' classic rule for env names (a C identifier that may also hold '-' and '.');
# newer servers accept more, older kubelets and shells do not.
ENV_NAME_PATTERN: Final = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"

# --- ConfigMap keys -------------------------------------------------------------------------------

CONFIG_MAP_KEY_PATTERN: Final = r"^[-._a-zA-Z0-9]+$"
# IsConfigMapKey whole: also not '.' or '..' and not starting with '..' (a key is a file name in
# a mounted volume). RE2 has no look-ahead, so the leading dots are spelled out.
CONFIG_MAP_KEY: Final = KubeString(
    "a ConfigMap or Secret key (a-z, A-Z, 0-9, '-', '_', '.'; not '.' or '..', not starting with '..')",
    r"^([-_a-zA-Z0-9][-._a-zA-Z0-9]*|\.[-_a-zA-Z0-9][-._a-zA-Z0-9]*)$",
    253,
)

# --- paths inside volumes -------------------------------------------------------------------------

# One element of a path that is not '..' (validatePathNoBacksteps splits on '/').
_PATH_ELEMENT: Final = r"(|\.|[^./][^/]*|\.[^./][^/]*|\.\.[^/]+)"
_FIRST_ELEMENT: Final = r"(\.|[^./][^/]*|\.[^./][^/]*|\.\.[^/]+)"
# validateLocalDescendingPath (subPath, items' paths): relative and no '..' element.
LOCAL_PATH: Final = KubeString(
    "a relative path without '..' elements",
    rf"^{_FIRST_ELEMENT}(/{_PATH_ELEMENT})*$",
    4096,
)
# validateLocalNonReservedPath (a volume item's path): the same, and not starting with '..'.
ITEM_PATH: Final = KubeString(
    "a relative path without '..' elements, not starting with '..'",
    rf"^(\.|[^./][^/]*|\.[^./][^/]*)(/{_PATH_ELEMENT})*$",
    4096,
)
# validatePathNoBacksteps (hostPath's path): no '..' element.
NO_BACKSTEPS_PATH: Final = KubeString(
    "a path without '..' elements",
    rf"^{_PATH_ELEMENT}(/{_PATH_ELEMENT})*$",
    4096,
)

# --- image references (github.com/distribution/reference, regexp.go) ------------------------------

_ALNUM = "[a-z0-9]+"
_SEPARATOR = "(?:[._]|__|[-]+)"
_PATH_COMPONENT = f"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = "(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_TAG = "[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = "[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_PATTERN: Final = rf"^(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*(?::{_TAG})?(?:@{_DIGEST})?$"
# Pod creation accepts any image string; a malformed one fails only at pull (InvalidImageName).
IMAGE: Final = KubeString(
    "an image reference: [registry[:port]/]repository[:tag][@digest], the repository in lower case",
    IMAGE_PATTERN,
    1024,
)

# --- quantities (CEL: Kubernetes' quantity library) ---------------------------------------------

# resource.parseQuantityString: sign, digits, '.', digits, then a suffix made of these letters,
# an optional sign and digits; the suffix must then be one Kubernetes knows.
_QUANTITY_RE: Final = re.compile(
    r"(?P<sign>[+-]?)(?P<num>[0-9]*)(?:\.(?P<denom>[0-9]*))?(?P<suffix>[eEinumkKMGTP]*[-+]?[0-9]*)"
)
_EXPONENT_RE: Final = re.compile(r"[eE][-+]?[0-9]+")


_BINARY: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL: Final = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


@dataclass(frozen=True)
class Quantity:
    """A parsed quantity, as far as the CEL quantity library's comparisons need it."""

    value: Decimal


def parse_quantity(text: str) -> Quantity | None:
    """resource.ParseQuantity's verdict on text (None: not a quantity) and its value."""
    match = _QUANTITY_RE.fullmatch(text)
    if not text or match is None:
        return None
    suffix = match["suffix"]
    magnitude = Decimal(f"{match['num'] or 0}.{match['denom'] or 0}")
    if match["sign"] == "-":
        magnitude = -magnitude
    if suffix in _BINARY:
        return Quantity(magnitude * 2 ** _BINARY[suffix])
    if suffix in _DECIMAL:
        return Quantity(magnitude.scaleb(_DECIMAL[suffix]))
    if _EXPONENT_RE.fullmatch(suffix):
        return Quantity(magnitude.scaleb(int(suffix[1:])))
    return None


def _is_quantity(value: celtypes.StringType) -> celtypes.BoolType:
    return celtypes.BoolType(parse_quantity(str(value)) is not None)


def _quantity(value: celtypes.StringType) -> Quantity:
    parsed = parse_quantity(str(value))
    if parsed is None:
        raise ValueError(f"invalid quantity: {value!r}")
    return parsed


def _matches(value: celtypes.StringType, pattern: celtypes.StringType) -> celtypes.BoolType:
    """CEL's matches() with RE2's `$` (the end of the text, never before a final newline)."""
    regex = str(pattern)
    if regex.endswith("$") and not regex.endswith("\\$"):
        regex = regex[:-1] + r"\Z"
    return celtypes.BoolType(re.search(regex, str(value)) is not None)


def _is_greater_than(left: Quantity, right: Quantity) -> celtypes.BoolType:
    return celtypes.BoolType(left.value > right.value)


def _compare_to(left: Quantity, right: Quantity) -> celtypes.IntType:
    return celtypes.IntType((left.value > right.value) - (left.value < right.value))


# The functions of Kubernetes' CEL libraries that CelRules may use, for cel-python; a rule
# calling anything else fails in pydantic with "undeclared reference", never silently.
CEL_FUNCTIONS: Final[dict[str, Callable[..., Any]]] = {
    "matches": _matches,
    "isQuantity": _is_quantity,
    "quantity": _quantity,
    "isGreaterThan": _is_greater_than,
    "compareTo": _compare_to,
}


def cel_is_positive_quantity(expr: str) -> str:
    return f"(isQuantity({expr}) && quantity({expr}).isGreaterThan(quantity('0')))"
