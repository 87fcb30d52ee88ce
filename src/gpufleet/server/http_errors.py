"""Errors the API adds to the domain's tree, one per HTTP answer a user mistake can get."""

from __future__ import annotations

from gpufleet.domain.errors import GpufleetError, UnknownNameError


class NotFoundError(UnknownNameError):
    """An unknown job, queue, node or token (404). Also what a team sees for another team's job."""


class UnauthorizedError(GpufleetError):
    """No token, or one that is unknown or revoked (401)."""


class ForbiddenError(GpufleetError):
    """A valid token that may not do this (403)."""


class TeamTokenRefusedError(ForbiddenError):
    """A team token on a control plane that refuses them: it runs every job as its own user (403). The API
    and the dashboard's sign-in both answer it."""


class ConflictError(GpufleetError):
    """The request clashes with the current state: cancel a finished job, delete a busy queue (409)."""


class UnavailableError(GpufleetError):
    """What was asked for is somewhere not reachable now, e.g. a log on a node that is down (503)."""
