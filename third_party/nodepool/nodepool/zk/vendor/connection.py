# This file is derived from the Kazoo project
# Licensed under the Apache License, Version 2.0 (the "License"); you may
# not use this file except in compliance with the License. You may obtain
# a copy of the License at
#
#      http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS, WITHOUT
# WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied. See the
# License for the specific language governing permissions and limitations
# under the License.

from kazoo.exceptions import (
    EXCEPTIONS,
    NoNodeError,
)
from kazoo.loggingsupport import BLATHER
from kazoo.protocol.connection import (
    ConnectionHandler,
    CREATED_EVENT,
    DELETED_EVENT,
    CHANGED_EVENT,
    CHILD_EVENT,
    CLOSE_RESPONSE,
)
from kazoo.protocol.serialization import (
    Close,
    Exists,
    Transaction,
    GetChildren,
    GetChildren2,
    Watch,
)
from kazoo.protocol.states import (
    Callback,
    WatchedEvent,
    EVENT_TYPE_MAP,
)

from nodepool.zk.vendor.serialization import (
    AddWatch,
    RemoveWatches,
)
from nodepool.zk.vendor.states import (
    AddWatchMode,
    WatcherType,
)


class ZuulConnectionHandler(ConnectionHandler):
    def _find_persistent_recursive_watchers(self, path):
        parts = path.split("/")
        watchers = []
        for count in range(len(parts)):
            candidate = "/".join(parts[: count + 1])
            if not candidate:
                candidate = '/'
            watchers.extend(
                self.client._persistent_recursive_watchers.get(candidate, [])
            )
        return watchers

    def _read_watch_event(self, buffer, offset):
        client = self.client
        watch, offset = Watch.deserialize(buffer, offset)
        path = watch.path

        self.logger.debug("Received EVENT: %s", watch)

        watchers = []

        if watch.type in (CREATED_EVENT, CHANGED_EVENT):
            watchers.extend(client._data_watchers.pop(path, []))
            watchers.extend(client._persistent_watchers.get(path, []))
            watchers.extend(self._find_persistent_recursive_watchers(path))
        elif watch.type == DELETED_EVENT:
            watchers.extend(client._data_watchers.pop(path, []))
            watchers.extend(client._child_watchers.pop(path, []))
            watchers.extend(client._persistent_watchers.get(path, []))
            watchers.extend(self._find_persistent_recursive_watchers(path))
        elif watch.type == CHILD_EVENT:
            watchers.extend(client._child_watchers.pop(path, []))
        else:
            self.logger.warn("Received unknown event %r", watch.type)
            return

        # Strip the chroot if needed
        path = client.unchroot(path)
        ev = WatchedEvent(EVENT_TYPE_MAP[watch.type], client._state, path)

        # Last check to ignore watches if we've been stopped
        if client._stopped.is_set():
            return

        # Dump the watchers to the watch thread
        for watch in watchers:
            client.handler.dispatch_callback(Callback("watch", watch, (ev,)))

    def _read_response(self, header, buffer, offset):
        client = self.client
        request, async_object, xid = client._pending.popleft()
        if header.zxid and header.zxid > 0:
            client.last_zxid = header.zxid
        if header.xid != xid:
            exc = RuntimeError(
                "xids do not match, expected %r " "received %r",
                xid,
                header.xid,
            )
            async_object.set_exception(exc)
            raise exc

        # Determine if its an exists request and a no node error
        exists_error = (
            header.err == NoNodeError.code and request.type == Exists.type
        )

        # Set the exception if its not an exists error
        if header.err and not exists_error:
            callback_exception = EXCEPTIONS[header.err]()
            self.logger.debug(
                "Received error(xid=%s) %r", xid, callback_exception
            )
            if async_object:
                async_object.set_exception(callback_exception)
        elif request and async_object:
            if exists_error:
                # It's a NoNodeError, which is fine for an exists
                # request
                async_object.set(None)
            else:
                try:
                    response = request.deserialize(buffer, offset)
                except Exception as exc:
                    self.logger.exception(
                        "Exception raised during deserialization "
                        "of request: %s",
                        request,
                    )
                    async_object.set_exception(exc)
                    return
                self.logger.debug(
                    "Received response(xid=%s): %r", xid, response
                )

                # We special case a Transaction as we have to unchroot things
                if request.type == Transaction.type:
                    response = Transaction.unchroot(client, response)

                async_object.set(response)

            # Determine if watchers should be registered or unregistered
            if not client._stopped.is_set():
                watcher = getattr(request, "watcher", None)
                if watcher:
                    if isinstance(request, AddWatch):
                        if request.mode == AddWatchMode.PERSISTENT:
                            client._persistent_watchers[request.path].add(
                                watcher
                            )
                        elif request.mode == AddWatchMode.PERSISTENT_RECURSIVE:
                            client._persistent_recursive_watchers[
                                request.path
                            ].add(watcher)
                    elif isinstance(request, (GetChildren, GetChildren2)):
                        client._child_watchers[request.path].add(watcher)
                    else:
                        client._data_watchers[request.path].add(watcher)
                if isinstance(request, RemoveWatches):
                    if request.watcher_type == WatcherType.CHILDREN:
                        client._child_watchers.pop(request.path, None)
                    elif request.watcher_type == WatcherType.DATA:
                        client._data_watchers.pop(request.path, None)
                    elif request.watcher_type == WatcherType.ANY:
                        client._child_watchers.pop(request.path, None)
                        client._data_watchers.pop(request.path, None)
                        client._persistent_watchers.pop(request.path, None)
                        client._persistent_recursive_watchers.pop(
                            request.path, None
                        )

        if isinstance(request, Close):
            self.logger.log(BLATHER, "Read close response")
            return CLOSE_RESPONSE
