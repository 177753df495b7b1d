import msched

for kw in [
    dict(compiler="Inductor"),
    dict(compiler=None),
    dict(num_streams=0),
    dict(num_streams=1, compiler="inductor"),
    dict(num_streams=10**6, compiler="inductor"),
    dict(num_streams=True),
    dict(num_streams=2.0),
    dict(verify="no", compiler="inductor"),
    dict(piecewise="yes", compiler="inductor"),
    dict(split_ops=[], piecewise=True, compiler="inductor"),
    dict(split_ops="msched::attention", compiler="inductor"),
]:
    try:
        b = msched.backend(**kw)
        print(kw, "-> accepted", b.config)
    except Exception as e:
        print(kw, "->", type(e).__name__, isinstance(e, msched.MschedError), str(e)[:160])
