"""Reading a watch in a test: the first `count` events, then stop it."""

from gpushare.cluster import Watch, WatchEvent
from gpushare.objects import Node, Pod


def take(watch: Watch[Pod] | Watch[Node], count: int) -> list[WatchEvent]:
    events = []
    for event in watch:
        events.append(event)
        if len(events) == count:
            break
    watch.stop()
    return events
