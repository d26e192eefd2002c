"""Protocols: pre-registered YAML files parsed into frozen dataclasses, hashed and frozen.

    readers       typed values of a protocol mapping; every error names file, key and value
    sections      what every kind shares: sut, sampling, groups, profiles (`resolve`)
    canonical     plain form and canonical hash
    strict_yaml   the YAML reader (keys given twice refused, key lines remembered)
    registration  freeze / registration / check_registered against frozen.lock
    schema        the distribution protocol (no top-level `kind`): Protocol, parse_protocol

The quality and performance kinds keep their schemas with their runs (`specval.quality.protocol`,
`specval.performance.protocol`). This package re-exports the public names the single module
`specval.protocol` had, so `from specval.protocol import load_protocol, Protocol, ...` still works.
"""

from specval.protocol.canonical import canonical_hash, plain_form
from specval.protocol.readers import MAX_INT, NAME_PATTERN, ProtocolError
from specval.protocol.registration import (
    CHANGED,
    FROZEN,
    LOCK_FILE_NAME,
    NOT_FROZEN,
    check_registered,
    freeze,
    lock_path,
    read_lock,
    registration,
)
from specval.protocol.schema import (
    GATING_ROLES,
    MAX_ALPHA,
    MAX_POSITIONS,
    MAX_POWER,
    MAX_STAGES,
    MIN_ALPHA,
    MIN_POWER,
    MULTIPLICITY_METHODS,
    ONE_STAGE,
    ROLES,
    TEST_KINDS,
    ConfirmationSpec,
    Protocol,
    SequentialSpec,
    TestSpec,
    load_protocol,
    parse_protocol,
)
from specval.protocol.sections import NOSPEC_MODE, PROFILE_KEYS, AnyProtocol, GroupSpec, SamplingSpec, SutSpec, resolve
from specval.protocol.strict_yaml import line_of, read_yaml

__all__ = [
    "AnyProtocol",
    "CHANGED",
    "ConfirmationSpec",
    "FROZEN",
    "GATING_ROLES",
    "GroupSpec",
    "LOCK_FILE_NAME",
    "MAX_ALPHA",
    "MAX_INT",
    "MAX_POSITIONS",
    "MAX_POWER",
    "MAX_STAGES",
    "MIN_ALPHA",
    "MIN_POWER",
    "MULTIPLICITY_METHODS",
    "NAME_PATTERN",
    "NOSPEC_MODE",
    "NOT_FROZEN",
    "ONE_STAGE",
    "PROFILE_KEYS",
    "Protocol",
    "ProtocolError",
    "ROLES",
    "SamplingSpec",
    "SequentialSpec",
    "SutSpec",
    "TEST_KINDS",
    "TestSpec",
    "canonical_hash",
    "check_registered",
    "freeze",
    "line_of",
    "load_protocol",
    "lock_path",
    "parse_protocol",
    "plain_form",
    "read_lock",
    "read_yaml",
    "registration",
    "resolve",
]
