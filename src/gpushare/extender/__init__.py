"""The scheduler extender and admission webhook: `gpushare-extender` (see main.py).

service.py assembles one extender over any gpushare.cluster.Cluster; cache.py is its
picture of the cluster, fittable.py the per-node answers it keeps ready, verbs.py and
binder.py answer kube-scheduler, webhook.py the API server, app.py serves them.
"""
