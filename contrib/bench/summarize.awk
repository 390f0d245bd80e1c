# Summarize one run of contrib/bench/run.sh: reads meta.tsv, na.tsv,
# layouts.tsv and raw.tsv (in that order) and writes, into the directory
# given as -v out=DIR, results.json (one object per cell and metric, with the
# median, every run and why the layout), results.md (tables with rc_vqp/cma
# and rc_vqp/posix ratios and the targets of issue 7) and bw.dat
# (primary-layout bandwidth vs size for plot.gp).
BEGIN {
    FS = "\t"
    ntests = split("put_bw put_lat get_bw am_lat am_bw", tests, " ")
    nsizes = split("8 4096 65536 1048576 8388608", sizes, " ")
    ntls = split("rc_vqp cma posix", tls, " ")
    # ucx_perftest -f -v columns: iterations, 50.0_percentile_lat, avg_lat,
    # overall_lat, avg_bw, overall_bw, avg_mr, overall_mr
    nmetrics = split("latency_p50 latency_avg bandwidth msg_rate", metrics, " ")
    col["latency_p50"] = 2; unit["latency_p50"] = "us"
    col["latency_avg"] = 4; unit["latency_avg"] = "us"
    col["bandwidth"] = 6;   unit["bandwidth"] = "MB/s"
    col["msg_rate"] = 8;    unit["msg_rate"] = "msg/s"
}

FILENAME ~ /meta\.tsv$/ { meta[$1] = $2; metakeys[++nmeta] = $1; next }
FILENAME ~ /na\.tsv$/   { na[$1, $2, $3] = $4; next }
FILENAME ~ /layouts\.tsv$/ { why[$1, $2, $3, $4] = $5; next }

FNR == 1 { next }  # raw.tsv header
{
    test = $1; tl = $2; layout = $3; size = $4; role = $5; status = $7
    key = test SUBSEP tl SUBSEP layout SUBSEP size
    if (!(key in seen)) {
        seen[key] = 1
        order[++ncells] = key
        roleof[key] = role
        if (role == "primary") primary[test, tl, size] = layout
        else extras[test, size] = extras[test, size] " " layout
    }
    nruns[key]++
    if (status != "ok") { nfail[key]++; next }
    split($8, f, ",")
    for (i = 1; i <= nmetrics; i++) {
        m = metrics[i]
        if (metric_ok(test, m)) {
            n = ++nvals[key, m]
            vals[key, m, n] = f[col[m]] + 0
        }
    }
}

function metric_ok(test, m) {
    if (test ~ /_lat$/) return m ~ /^latency/
    return m !~ /^latency/
}

function main_metric(test) { return test ~ /_lat$/ ? "latency_p50" : "bandwidth" }

function median(key, m,    n, i, j, t, a) {
    n = nvals[key, m] + 0
    if (n == 0) return ""
    for (i = 1; i <= n; i++) a[i] = vals[key, m, i]
    for (i = 2; i <= n; i++) {  # insertion sort, a handful of values
        t = a[i]
        for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]
        a[j + 1] = t
    }
    if (n % 2) return a[(n + 1) / 2]
    return (a[n / 2] + a[n / 2 + 1]) / 2
}

function runs_json(key, m,    n, i, s) {
    n = nvals[key, m] + 0
    s = ""
    for (i = 1; i <= n; i++) s = s (i > 1 ? ", " : "") vals[key, m, i]
    return "[" s "]"
}

function jstr(s) {
    gsub(/\\/, "\\\\", s); gsub(/"/, "\\\"", s)
    return "\"" s "\""
}

function fmt(v) {
    if (v == "") return "failed"
    if (v >= 1000) return commas(sprintf("%.0f", v))
    if (v >= 100) return sprintf("%.0f", v)
    if (v >= 10) return sprintf("%.1f", v)
    if (v >= 1) return sprintf("%.2f", v)
    return sprintf("%.3f", v)
}

function commas(s) {
    while (s ~ /[0-9][0-9][0-9][0-9]/) sub(/[0-9][0-9][0-9]($|,)/, ",&", s)
    return s
}

function human(size) {
    if (size >= 1048576) return (size / 1048576) " MiB"
    if (size >= 1024) return (size / 1024) " KiB"
    return size " B"
}

# value of the cell TEST TL LAYOUT SIZE in the main metric, "" if none
function cellval(test, tl, layout, size) {
    return median(test SUBSEP tl SUBSEP layout SUBSEP size, main_metric(test))
}

function ratio(a, b) {
    if (a == "" || b == "" || b == 0) return "n/a"
    return sprintf("%.2f", a / b)
}

# the text of one baseline cell in the markdown table
function basecell(test, tl, size,    l, v) {
    if ((test, tl, size) in na) return "n/a: " na[test, tl, size]
    l = primary[test, tl, size]
    v = cellval(test, tl, l, size)
    return fmt(v) " (" l ")"
}

function row(test, size, layout, label,    v, c, p, vc, vp) {
    v = cellval(test, "rc_vqp", layout, size)
    vc = ((test, "cma", size) in na) ? "" : cellval(test, "cma", primary[test, "cma", size], size)
    vp = ((test, "posix", size) in na) ? "" : cellval(test, "posix", primary[test, "posix", size], size)
    printf "| %s | %s (%s) | %s | %s | %s | %s |\n", label, fmt(v), layout,
        basecell(test, "cma", size), basecell(test, "posix", size),
        ratio(v, vc), ratio(v, vp) > md
}

function target(desc, test, size, base, limit, higher,    v, b, r, ok) {
    v = cellval(test, "rc_vqp", primary[test, "rc_vqp", size], size)
    b = cellval(test, base, primary[test, base, size], size)
    if (v == "" || b == "") {
        printf "| %s | %s | - | not measured |\n", desc, human(size) > md
        return
    }
    r = v / b
    ok = higher ? (r >= limit) : (r <= limit)
    printf "| %s | %s | %.2f | %s |\n", desc, human(size), r,
        ok ? "met" : sprintf("**missed** (%.0f%% %s the target)",
                             100 * (higher ? (limit - r) / limit : (r - limit) / limit),
                             higher ? "below" : "above") > md
}

END {
    json = out "/results.json"; md = out "/results.md"; dat = out "/bw.dat"

    # ---- JSON
    printf "{\n  \"meta\": {\n" > json
    for (i = 1; i <= nmeta; i++)
        printf "    %s: %s%s\n", jstr(metakeys[i]), jstr(meta[metakeys[i]]),
            (i < nmeta) ? "," : "" > json
    printf "  },\n  \"cells\": [\n" > json
    first = 1
    for (t = 1; t <= ntests; t++) for (s = 1; s <= nsizes; s++) for (k = 1; k <= ntls; k++) {
        test = tests[t]; size = sizes[s]; tl = tls[k]
        if ((test, tl, size) in na) {
            printf "%s    {\"test\": %s, \"transport\": %s, \"layout\": null, \"size\": %d, " \
                "\"metric\": %s, \"median\": null, \"runs\": [], \"unit\": %s, \"na\": %s}",
                first ? "" : ",\n", jstr(test), jstr(tl), size, jstr(main_metric(test)),
                jstr(unit[main_metric(test)]), jstr(na[test, tl, size]) > json
            first = 0
        }
        for (c = 1; c <= ncells; c++) {
            split(order[c], kk, SUBSEP)
            if (kk[1] != test || kk[2] != tl || kk[4] != size) continue
            for (i = 1; i <= nmetrics; i++) {
                m = metrics[i]
                if (!metric_ok(test, m)) continue
                v = median(order[c], m)
                printf "%s    {\"test\": %s, \"transport\": %s, \"layout\": %s, \"size\": %d, " \
                    "\"metric\": %s, \"median\": %s, \"runs\": %s, \"unit\": %s, " \
                    "\"role\": %s, \"layout_why\": %s, \"failed_runs\": %d}",
                    first ? "" : ",\n", jstr(test), jstr(tl), jstr(kk[3]), size, jstr(m),
                    v == "" ? "null" : v, runs_json(order[c], m), jstr(unit[m]),
                    jstr(roleof[order[c]]), jstr(why[test, tl, size, kk[3]]),
                    nfail[order[c]] + 0 > json
                first = 0
            }
        }
    }
    printf "\n  ]\n}\n" > json

    # ---- markdown
    printf "## rc_vqp vs cma and posix, ucx_perftest (UCT level)\n\n" > md
    printf "%s; %s; %s cores (%s); UCX %s; rc_vqp %s; NUM_QPS=%s; median of %s runs" \
        " (each its own server/client pair); load average before %s, after %s.\n\n",
        meta["date"], meta["host"], substr(meta["cpu"], 1, index(meta["cpu"], " x ") - 1),
        substr(meta["cpu"], index(meta["cpu"], " x ") + 3), meta["ucx"], meta["commit"],
        meta["num_qps"], meta["runs"], meta["load_before"], meta["load_after"] > md
    if (meta["iteration_scale"] != "1/1")
        printf "**Quick run (%s of the iterations): not for numbers.**\n\n",
            meta["iteration_scale"] > md
    printf "Cells: median, (data layout). Ratios are rc_vqp / baseline of the same" \
        " metric: for bandwidth higher is better, for latency lower is better." \
        " MB/s as ucx_perftest prints it (2^20 bytes/s); latency is ucx_perftest's" \
        " one-way figure, the 50th percentile of each run.\n" > md
    for (t = 1; t <= ntests; t++) {
        test = tests[t]
        printf "\n### %s (%s)\n\n", test,
            test ~ /_lat$/ ? "latency, us, lower is better" : "bandwidth, MB/s, higher is better" > md
        printf "| size | rc_vqp | cma | posix | rc_vqp/cma | rc_vqp/posix |\n" > md
        printf "|---|---|---|---|---|---|\n" > md
        for (s = 1; s <= nsizes; s++) {
            size = sizes[s]
            if ((test, "rc_vqp", size) in na) {
                printf "| %s | n/a: %s | %s | %s | n/a | n/a |\n", human(size),
                    na[test, "rc_vqp", size], basecell(test, "cma", size),
                    basecell(test, "posix", size) > md
                continue
            }
            row(test, size, primary[test, "rc_vqp", size], human(size))
            n = split(extras[test, size], ex, " ")
            for (e = 1; e <= n; e++)
                row(test, size, ex[e], human(size) " (rc_vqp " ex[e] ")")
        }
        if (test == "put_bw") {
            key = "put_bw" SUBSEP "rc_vqp" SUBSEP primary["put_bw", "rc_vqp", 8] SUBSEP 8
            kc = "put_bw" SUBSEP "cma" SUBSEP primary["put_bw", "cma", 8] SUBSEP 8
            kp = "put_bw" SUBSEP "posix" SUBSEP primary["put_bw", "posix", 8] SUBSEP 8
            printf "\n8 B put message rate (msg/s): rc_vqp %s, cma %s, posix %s.\n",
                fmt(median(key, "msg_rate")), fmt(median(kc, "msg_rate")),
                fmt(median(kp, "msg_rate")) > md
        }
    }

    printf "\n### Targets of issue 7 (ratios in this run)\n\n" > md
    printf "| target | size | ratio | result |\n|---|---|---|---|\n" > md
    for (s = 3; s <= nsizes; s++)
        target("put_bw >= 0.9x cma", "put_bw", sizes[s], "cma", 0.9, 1)
    target("8 B put message rate >= 2x cma", "put_bw", 8, "cma", 2, 1)
    target("put_lat <= 1.2x cma", "put_lat", 8, "cma", 1.2, 0)
    target("am_lat <= 3x posix", "am_lat", 8, "posix", 3, 0)

    # ---- plot data: one named block per test and transport
    for (t = 1; t <= ntests; t++) {
        test = tests[t]
        if (test ~ /_lat$/) continue
        for (k = 1; k <= ntls; k++) {
            tl = tls[k]
            printf "# %s %s\n", test, tl > dat
            npts = 0
            for (s = 1; s <= nsizes; s++) {
                size = sizes[s]
                if ((test, tl, size) in na) continue
                v = cellval(test, tl, primary[test, tl, size], size)
                if (v == "") continue
                printf "%d %s %s\n", size, v, primary[test, tl, size] > dat
                npts++
            }
            if (npts == 0) printf "8 NaN none\n" > dat
            printf "\n\n" > dat
        }
    }
}
