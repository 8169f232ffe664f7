"""`gpushare simulate`'s harness: the openb trace replayed through the extender's
placement policies, the way the FGD paper (Weng et al., ATC'23) measured them.
See docs/placement.md#the-benchmark."""
