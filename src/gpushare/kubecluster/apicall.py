"""One call of the official client, and its failure as the cluster port's error:
404 NotFound, 409 Conflict, 410 Expired, 422 Invalid with the fields the API server
named, anything else ClusterError with the server's message."""

import json
from typing import Any, TypeVar

from kubernetes.client.exceptions import ApiException
from pydantic import BaseModel, ValidationError

from gpushare.cluster import ClusterError, Conflict, Expired, Invalid, NotFound
from gpushare.dra.validation import FieldError

_Model = TypeVar("_Model", bound=BaseModel)


def perform(what: str, call: Any, *args: Any, **kwargs: Any) -> Any:
    """Makes one API call; its failure raised as the port's error, saying what failed."""
    try:
        return call(*args, **kwargs)
    except ApiException as err:
        raise translated(err, what) from err
    except Exception as err:  # connection refused, TLS, DNS
        raise ClusterError(f"{what}: {err}") from err


def read_json(what: str, response: Any) -> Any:
    """The JSON of an answer asked for with `_preload_content=False`."""
    try:
        return json.loads(response.data)
    except Exception as err:  # the connection dropped, or not JSON
        raise ClusterError(f"{what}: {err}") from err


def decoded(kind: type[_Model], raw: Any) -> _Model:
    try:
        return kind.model_validate(raw)
    except ValidationError as err:
        raise ClusterError(f"the API sent a {kind.__name__} gpushare cannot read: {err}") from err


def discard(response: Any) -> None:
    """Reads an answer we do not decode, then hands its connection back: released
    unread, the connection would be dropped (a new one for the next request) or, when
    the body arrives late, garble the next answer read from it."""
    response.drain_conn()
    response.release_conn()


def status_message(err: ApiException) -> str:
    status = _status(err)
    if status.get("message"):
        return str(status["message"])
    return str(err.reason or err.body or f"HTTP {err.status}")


def translated(err: ApiException, what: str) -> ClusterError:
    if err.status == 422:
        return _invalid(err, what)
    return port_error(err.status, f"{what}: {status_message(err)}")


def port_error(code: int | None, message: str) -> ClusterError:
    if code == 404:
        return NotFound(message)
    if code == 409:
        return Conflict(message)
    if code == 410:
        return Expired(message)
    return ClusterError(f"{message} (HTTP {code})")


def _invalid(err: ApiException, what: str) -> Invalid:
    """The Status of a 422 names the object (details.kind, details.name) and each field
    refused (details.causes[].field, .message)."""
    details = _status(err).get("details") or {}
    errors = [
        FieldError(str(cause.get("field") or ""), str(cause.get("message") or ""))
        for cause in details.get("causes") or ()
    ]
    subject = f'{details["kind"]} "{details.get("name", "")}"' if details.get("kind") else what
    return Invalid(subject, errors or [FieldError("", status_message(err))])


def _status(err: ApiException) -> dict[str, Any]:
    try:
        status = json.loads(err.body or "")
    except (TypeError, ValueError):
        return {}
    return status if isinstance(status, dict) else {}
