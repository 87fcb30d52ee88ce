"""List and watch one kind of object, as client-go's reflector does: a paged list, then a watch from its
resourceVersion with bookmarks (so a quiet watch still moves its version on), a new watch from the last version
seen when the server ends one, and a new list when that version is too old (410 Gone)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from gpufleet.adapters.kubernetes.kube_api import KubeApi, KubeApiError

log = logging.getLogger("gpufleet.kubernetes")

PAGE = 500
WATCH_S = 240


class Informer(threading.Thread):
    """Calls `on_list(items)` with every object after each (re)list and `on_event(type, obj)` for each change
    (ADDED, MODIFIED, DELETED), in this thread. `synced` is set after the first list."""

    def __init__(
        self,
        api: KubeApi,
        path: str,
        on_list: Callable[[list[dict[str, Any]]], None],
        on_event: Callable[[str, dict[str, Any]], None],
        *,
        name: str,
        halt: threading.Event,
        field_selector: str | None = None,
    ) -> None:
        super().__init__(name=f"gpufleet-k8s-{name}", daemon=True)
        self.api = api
        self.path = path
        self.on_list = on_list
        self.on_event = on_event
        self.halt = halt
        self.field_selector = field_selector
        self.synced = threading.Event()
        self.relists = 0
        self.resource_version = ""

    def list_all(self) -> tuple[list[dict[str, Any]], str]:
        items: list[dict[str, Any]] = []
        token: str | None = None
        version = ""
        while True:
            page = self.api.list(self.path, limit=PAGE, fieldSelector=self.field_selector, **{"continue": token})
            items.extend(page.get("items") or ())
            meta = page.get("metadata") or {}
            version = meta.get("resourceVersion", version)
            token = meta.get("continue")
            if not token:
                return items, version

    def run(self) -> None:
        failures = 0
        while not self.halt.is_set():
            try:
                items, self.resource_version = self.list_all()
                self.on_list(items)
                self.relists += 1
                self.synced.set()
                failures = 0
                self._watch()
            except KubeApiError as error:
                failures += 1
                if failures in (1, 10) or failures % 100 == 0:
                    log.warning("kubernetes: listing %s failed (%s); trying again", self.path, error)
                self.halt.wait(min(5.0, 0.2 * failures))
            except Exception:
                log.exception("kubernetes: the %s informer failed; listing again", self.path)
                self.halt.wait(1.0)

    def _watch(self) -> None:
        """Watch until the version is too old (return: list again) or the thread is told to stop."""
        quiet_failures = 0
        while not self.halt.is_set():
            try:
                for event in self.api.watch(self.path, self.resource_version, WATCH_S, self.field_selector):
                    kind = event.get("type", "")
                    obj = event.get("object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            return
                        raise KubeApiError(int(obj.get("code") or 0), str(obj.get("message", "watch error")))
                    version = (obj.get("metadata") or {}).get("resourceVersion")
                    if version:
                        self.resource_version = version
                    if kind != "BOOKMARK":
                        self.on_event(kind, obj)
                    if self.halt.is_set():
                        return
                quiet_failures = 0
            except KubeApiError as error:
                if error.status == 410:
                    return
                quiet_failures += 1
                if quiet_failures > 5:
                    raise
                self.halt.wait(min(2.0, 0.1 * quiet_failures))
