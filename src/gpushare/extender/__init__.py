"""The scheduler extender and admission webhook: `gpushare-extender` (see main.py).

service.py assembles one extender over any gpushare.cluster.Cluster; cache.py is its
picture of the cluster, answertable.py the per-node answers it keeps ready, waiting.py
its books of pods left waiting (for requeue.py and unserved.py), pendingpod.py the
pod being placed as the verbs hand it over; verbs.py and binder.py answer
kube-scheduler, webhook.py the API server, app.py serves them.
"""
