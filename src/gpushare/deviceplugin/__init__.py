"""The kubelet device plugin: advertises gpushare's resources to the kubelet and
hands each admitted container its GPU slice (plugin.py has the map of the parts)."""
