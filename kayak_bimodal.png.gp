set terminal pngcairo size 900,800
set output 'kayak_bimodal.png'
set multiplot layout 3,1 title 'Kayak through a bimodal phase change (light 1 us / heavy 20 us compute, every 2 s)'
set xlabel 'time (s)'
set grid
set ylabel 'X (RPC fraction)'
set yrange [0:1]
plot 'kayak_bimodal.png.tsv' using 1:3 with lines title 'X'
set ylabel 'window'
set autoscale y
plot 'kayak_bimodal.png.tsv' using 1:4 with lines title 'window'
set ylabel 'ops/s'
plot 'kayak_bimodal.png.tsv' using 1:5 with lines title 'throughput'
unset multiplot
