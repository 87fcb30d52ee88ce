"""Job tokens: what a running job presents to report its progress, and nothing else.

The executor puts `GPUFLEET_REPORT_URL` and `GPUFLEET_REPORT_TOKEN` in each worker's environment. The token
is `gfj_<attempt>.<HMAC-SHA256(key, job id, attempt)>`, the key a random secret the control plane keeps in its
store (settings) and never gives a job. So a token

- names one job and one attempt: it is checked against the job id in the request's path, and the attempt
  must be the job's current one, still holding its resources; it dies when the attempt ends (a retry, a
  restart after preemption or a finished job gets a new attempt number and refuses the old token), with no
  list of tokens to revoke or clean up;
- is accepted by the report endpoint only: the API's other routes look tokens up among `gf_…` tokens in the
  store, where job tokens are not, so a job holding one can read nothing and submit nothing;
- reveals nothing of the key (HMAC), so a job cannot mint a token for another job.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping

from gpufleet.domain.records import JobRecord
from gpufleet.ports.admin import AdminStore
from gpufleet.server.http_errors import UnauthorizedError

JOB_TOKEN_PREFIX = "gfj_"
KEY_SETTING = "job_token_key"
URL_ENV = "GPUFLEET_REPORT_URL"
TOKEN_ENV = "GPUFLEET_REPORT_TOKEN"
REPORT_PATH = "/v1/jobs/{job_id}/reports"


class JobTokens:
    """Makes and checks job tokens with the store's key (made on first use, kept across restarts, so jobs
    adopted after a restart still report)."""

    def __init__(self, store: AdminStore) -> None:
        key = store.get_setting(KEY_SETTING)
        if key is None:
            key = secrets.token_hex(32)
            store.set_setting(KEY_SETTING, key)
        self._key = bytes.fromhex(key)

    def _mac(self, job_id: str, attempt: int) -> str:
        message = f"{job_id}\x00{attempt}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def token(self, job_id: str, attempt: int) -> str:
        return f"{JOB_TOKEN_PREFIX}{attempt}.{self._mac(job_id, attempt)}"

    def env(self, base_url: str, job_id: str, attempt: int) -> Mapping[str, str]:
        """What a worker of this attempt gets to report with."""
        return {
            URL_ENV: base_url.rstrip("/") + REPORT_PATH.format(job_id=job_id),
            TOKEN_ENV: self.token(job_id, attempt),
        }

    def attempt_of(self, authorization: str | None, job_id: str) -> int:
        """The attempt a request's job token was made for. UnauthorizedError when it is missing or not a job
        token of this job."""
        scheme, _, secret = (authorization or "").partition(" ")
        secret = secret.strip()
        if scheme.lower() != "bearer" or not secret.startswith(JOB_TOKEN_PREFIX):
            raise UnauthorizedError(
                "reports need the job's own token",
                f"send `Authorization: Bearer ${TOKEN_ENV}` from inside the job (the executor sets it)",
            )
        attempt_text, _, mac = secret[len(JOB_TOKEN_PREFIX) :].partition(".")
        if not attempt_text.isdigit() or not hmac.compare_digest(mac, self._mac(job_id, int(attempt_text))):
            raise UnauthorizedError(
                f"the token is not a job token of job {job_id!r}", f"send the ${TOKEN_ENV} of that job's workers"
            )
        return int(attempt_text)


def check_current(record: JobRecord, attempt: int) -> None:
    """UnauthorizedError unless `attempt` is the job's current attempt and it still holds its resources."""
    if record.attempt != attempt or not record.holds_resources:
        raise UnauthorizedError(
            f"the job token of job {record.id!r} attempt {attempt} has expired: that attempt has ended "
            f"(the job is {record.state.value}, attempt {record.attempt})",
            "nothing to do: reports of an ended attempt are not kept; a new attempt gets a new token",
        )
