"""airspeed velocity benchmarks of nblstm (see ``asv_bench/asv.conf.json``)."""
