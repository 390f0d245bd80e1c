# gdb Python script: counters of a build with hang-counters.patch (see README.md)
import gdb
def P(s): gdb.write(s + "\n")
def ev(e):
    try: return gdb.parse_and_eval(e)
    except Exception as x: return "ERR(%s)" % x
for e in ["vqp_sw_idle.running", "vqp_sw_idle.stop", "vqp_sw_idle.period_us", "vqp_sw_idle_count", "vqp_sw_dev_word", "vqp_sw_idle_nvisit", "vqp_sw_idle_nlockfail"]:
    P("%s = %s" % (e, ev(e)))
for t in gdb.selected_inferior().threads():
    t.switch()
    P("thread %d lwp %d depth %s in_engine %s" % (t.num, t.ptid[1], ev("vqp_sw_dev_lock_depth"), ev("vqp_sw_in_engine")))
d = ev("vqp_sw_idle_devs")
while not isinstance(d, str) and int(d) != 0:
    s = d["shm"]
    P("dev %s idle_calls %d idle_runs %d progress_calls %d armed %d in_head %d in_tail %d event_fd %d" % (
        d["name"].string(), int(d["idle_calls"]), int(d["idle_runs"]), int(s["progress_calls"]), int(s["armed"]),
        int(s["in_head"]), int(s["in_tail"]), int(d["event_fd"])))
    d = d["idle_next"]
n = int(ev("uct_rc_vqp_ndiag"))
ty = gdb.lookup_type("uct_rc_vqp_iface_t").pointer()
osz = 8 + gdb.lookup_type("uct_iface_attr_t").sizeof
inf = gdb.selected_inferior()
import struct
for i in range(n):
    dg = ev("uct_rc_vqp_diag[%d]" % i)
    P("diag[%d] %s" % (i, dg))
    f = dg["iface"].cast(ty)
    cm = f["cm"]
    P("  cm lock %s depth %s progress_gen %s async_gen %s async_timer %s" % (cm["lock"], cm["lock_depth"], cm["progress_gen"], cm["async_gen"], cm["async_timer"]))
    P("  prog %s progress_flags %s" % (f["super"]["prog"], f["super"]["progress_flags"]))
    P("  cm num_deferred %s cq.ci %s stats %s" % (cm["num_deferred"], cm["cq"]["ci"], cm["stats"]))
    wi = None
    fa = int(f)
    for j in range(32):
        am = f["super"]["am"][j]
        cb = int(am["cb"]); a = int(am["arg"])
        if cb == 0 or a < 0x10000: continue
        try:
            if struct.unpack("<Q", bytes(inf.read_memory(a, 8)))[0] == fa:
                wi = a
                P("  am[%d] has the wiface as arg (proxy handler: deactivated)" % j)
                break
        except Exception: pass
    if wi:
        m = bytes(inf.read_memory(wi + osz, 56))
        worker, = struct.unpack_from("<Q", m, 0)
        efd, acnt, ceid, prx, post = struct.unpack_from("<iIiII", m, 28)
        fl = m[48]
        P("  wiface 0x%x iface 0x%x worker 0x%x event_fd %d activate_count %d check_events_id %d proxy_recv %d post %d flags 0x%x" % (
            wi, struct.unpack("<Q", bytes(inf.read_memory(wi, 8)))[0], worker, efd, acnt, ceid, prx, post, fl))
    else:
        args = sorted(set(int(f["super"]["am"][j]["arg"]) for j in range(32) if int(f["super"]["am"][j]["cb"]) != 0 and int(f["super"]["am"][j]["arg"]) >= 0x10000))
        P("  no handler has the wiface as arg (interface active); handler args (worker): %s" % " ".join("0x%x" % a for a in args))
