# Plot of contrib/bench results: bandwidth vs message size for put_bw,
# get_bw and am_bw, one line per transport (its primary data layout).
# usage: gnuplot -e "datafile='bw.dat'; outfile='bw.png'" plot.gp
set terminal pngcairo size 1500,520 font "sans,11" noenhanced
set output outfile
set logscale xy
set xtics ("8 B" 8, "4 KiB" 4096, "64 KiB" 65536, "1 MiB" 1048576, "8 MiB" 8388608)
set xrange [5:13000000]
set format y "%g"
set ylabel "MB/s (ucx_perftest: 2^20 B/s)"
set xlabel "message size"
set grid
set key top left
set datafile missing "NaN"
set multiplot layout 1,3 title "ucx_perftest bandwidth vs size: rc_vqp (software device) vs cma and posix"
do for [t in "put_bw get_bw am_bw"] {
    set title (t eq "am_bw" ? "am_bw (cma: no AM; rc_vqp and posix AM <= 8 KiB)" : t)
    cmd = "plot datafile index '".t." rc_vqp' using 1:2 with linespoints lw 2 pt 7 lt 1 title 'rc_vqp'"
    if (t ne "am_bw") {
        cmd = cmd.", datafile index '".t." cma' using 1:2 with linespoints lw 2 pt 5 lt 2 title 'cma'"
    }
    cmd = cmd.", datafile index '".t." posix' using 1:2 with linespoints lw 2 pt 9 lt 3 title 'posix'"
    eval cmd
}
unset multiplot
