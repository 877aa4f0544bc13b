# Command-line contract of the tpserve executable.
# Exit status and output checked together (tp_expect_test, tests/expect_run.cmake); usage errors exit 2.
tp_expect_test(cli.help RC 0 REGEX "Usage: tpserve <command>" LABELS unit COMMAND $<TARGET_FILE:tpserve> --help)
tp_expect_test(cli.version RC 0 REGEX "tpserve [0-9]+\\.[0-9]+\\.[0-9]+" LABELS unit
               COMMAND $<TARGET_FILE:tpserve> --version)
tp_expect_test(cli.unknown_command RC 2 REGEX "unknown command 'nosuchcmd'" LABELS unit
               COMMAND $<TARGET_FILE:tpserve> nosuchcmd)
tp_expect_test(cli.unknown_flag RC 2 REGEX "unknown option '--bogus'" LABELS unit
               COMMAND $<TARGET_FILE:tpserve> version --bogus)
# --kv-type: a bad value is a usage error naming the choices; f16 (default) and f32 caches give the
# same greedy text on the bundled model (fp16 rounds K/V by ~1e-3 relative, far below its top-2 gaps).
add_test(NAME cli.kv_type_bad COMMAND sh -c
  "out=$(\"$0\" generate -m \"$1\" -p Once -n 4 --kv-type f64 2>&1); rc=$?; echo \"$out\"; [ $rc -eq 2 ] && \
   echo \"$out\" | grep -q 'want auto, f16 or bf16 (half the memory of f32), q8_0 (about a quarter) or f32'"
  $<TARGET_FILE:tpserve> ${PROJECT_SOURCE_DIR}/models/stories260K.gguf)
set_tests_properties(cli.kv_type_bad PROPERTIES LABELS unit TIMEOUT 30)
# bf16 caches hold head sizes that are multiples of 16: the bundled model's 8 is refused, naming both
tp_expect_test(cli.kv_type_bf16_head RC 1 REGEX "KV cache type bf16 cannot hold head_dim 8 .*use f16 or f32" LABELS unit
               COMMAND $<TARGET_FILE:tpserve> generate -m ${PROJECT_SOURCE_DIR}/models/stories260K.gguf -p Once -n 4
                       --kv-type bf16)
add_test(NAME cli.kv_type_same_text COMMAND sh -c
  "a=$(\"$0\" generate -m \"$1\" -p 'Once upon a time' -n 64 --temp 0 --kv-type f16 2>/dev/null) && \
   b=$(\"$0\" generate -m \"$1\" -p 'Once upon a time' -n 64 --temp 0 --kv-type f32 2>/dev/null) && \
   [ -n \"$a\" ] && [ \"$a\" = \"$b\" ]"
  $<TARGET_FILE:tpserve> ${PROJECT_SOURCE_DIR}/models/stories260K.gguf)
set_tests_properties(cli.kv_type_same_text PROPERTIES LABELS unit TIMEOUT 60)
# launch --restart cannot apply to mpirun jobs (they cannot re-form in place): refused naming why.
tp_expect_test(cli.launch_restart_mpi RC 2 REGEX "--restart does not apply to --backend mpi: an MPI job cannot re-form"
               LABELS unit COMMAND $<TARGET_FILE:tpserve> launch -n 2 --backend mpi --restart 3 -- true)
# Every command's --help opens with a usage line that names the command (exit 0).
add_test(NAME cli.help_names_command COMMAND sh -c
  "bad=0; for c in version synth info generate plan shard serve launch bench 'bench comm' 'bench serve' \
   'bench kernels' 'bench gen' 'bench nodes' 'bench attn'; do \
     out=$(\"$0\" $c --help 2>&1); rc=$?; first=$(printf '%s\\n' \"$out\" | head -n 1); \
     case \"$first\" in 'Usage: '*\"tpserve $c \"*|'Usage: '*\"tpserve $c\") ;; *) echo \"$c: '$first'\"; bad=1;; esac; \
     [ $rc -eq 0 ] || { echo \"$c --help: exit $rc\"; bad=1; }; done; exit $bad"
  $<TARGET_FILE:tpserve>)
set_tests_properties(cli.help_names_command PROPERTIES LABELS unit TIMEOUT 30)
# bench comm --compare-mpi with --backend mpi would compare MPI with itself: a usage error, before any MPI start.
tp_expect_test(cli.compare_mpi_backend_mpi RC 2 REGEX "it would compare MPI with itself" LABELS unit
               COMMAND $<TARGET_FILE:tpserve> bench comm --compare-mpi --backend mpi)
# bench comm --gap-type: a weight type whose blocks divide N_EMBD, and only with --gap-bytes (usage errors).
tp_expect_test(cli.bench_comm_gap_type_bad RC 2 REGEX "--gap-type wants a weight type .*N_EMBD 48.*got 'q4_k'"
               LABELS unit COMMAND $<TARGET_FILE:tpserve> bench comm --decode 48 --gap-bytes 4K --gap-type q4_k)
tp_expect_test(cli.bench_comm_gap_type_alone RC 2 REGEX "--gap-type says how the --gap-bytes are read" LABELS unit
               COMMAND $<TARGET_FILE:tpserve> bench comm --decode 64 --gap-type q4_0)
# plan counts gpt-oss's KV layer by layer: 12 windowed layers hold rings of 128 + 512 positions, the
# 12 others the context (f16, 8 KV heads of 64: 13.9 MiB per KV head and sequence at 4096, not 24.0).
tp_expect_test(cli.plan_gptoss_windowed_kv RC 0
               REGEX "KV cache: 12 sliding-window layers x 640 positions .window 128 . batch 512. . 12 full layers x 4096 positions, 13.9 MiB per KV head"
               LABELS unit COMMAND $<TARGET_FILE:tpserve> plan --shape gpt-oss-20b --nodes a:64G --ctx-size 4096)
# serve --logit-bias is checked against the model's vocabulary at start: a token id out of range or a
# malformed entry ends serve with a message naming the flag.
tp_expect_test(cli.serve_logit_bias_range RC 1 REGEX "--logit-bias: '600\\+1' is not TOKEN_ID\\+BIAS.*below 512"
               LABELS unit TIMEOUT 60 COMMAND $<TARGET_FILE:tpserve> serve -m ${PROJECT_SOURCE_DIR}/models/stories260K.gguf
               --port 0 --threads 1 --logit-bias 7+2,600+1)
tp_expect_test(cli.serve_logit_bias_twice RC 1 REGEX "--logit-bias: token 7 is listed twice" LABELS unit TIMEOUT 60
               COMMAND $<TARGET_FILE:tpserve> serve -m ${PROJECT_SOURCE_DIR}/models/stories260K.gguf --port 0
               --threads 1 --logit-bias 7+2,9-100,7-1)
# bench attn: a bad depth or head size is a usage error naming the option; a small run times every path
# this CPU has (the JSON line of the plain C path is always there).
tp_expect_test(cli.bench_attn_bad_depth RC 2 REGEX "--depth '10': want up to 16 values in 64" LABELS unit
               COMMAND $<TARGET_FILE:tpserve> bench attn --depth 10)
tp_expect_test(cli.bench_attn_bad_head RC 2 REGEX "--head-dim 12 is not a multiple of 8" LABELS unit
               COMMAND $<TARGET_FILE:tpserve> bench attn --head-dim 12)
tp_expect_test(cli.bench_attn_runs RC 0 REGEX "path.:.c.,.item.:.prefill.,.head_dim.:32" LABELS unit
               TIMEOUT 60 COMMAND $<TARGET_FILE:tpserve> bench attn --head-dim 32 --gqa 4 --depth 256 --reps 1
               --kv-type q8_0 --json)
# --mib: the cache read from copies in memory (here 1 MiB of them, 32 copies of 32 KiB); out of range, or more than
# half of the machine's memory (the test asks for 1 PiB), is a usage error
tp_expect_test(cli.bench_attn_from_memory RC 0 REGEX "item.:.decode.,.head_dim.:32,.gqa.:4,.kv_type.:.f16.,.stream_mib.:1,"
               LABELS unit TIMEOUT 60 COMMAND $<TARGET_FILE:tpserve> bench attn --head-dim 32 --gqa 4 --depth 256
               --reps 3 --kv-type f16 --mib 1 --json)
tp_expect_test(cli.bench_attn_bad_mib RC 2 REGEX "--mib must be between 0 and 1073741824, got -1" LABELS unit
               COMMAND $<TARGET_FILE:tpserve> bench attn --mib -1)
tp_expect_test(cli.bench_attn_mib_past_memory RC 2 REGEX "--mib 1073741824 needs 1073741824 MiB, more than half of this machine's"
               LABELS unit COMMAND $<TARGET_FILE:tpserve> bench attn --mib 1073741824)
tp_expect_test(cli.bench_kernels_past_memory RC 2
               REGEX "--rows 1048576 --cols 1048576 --mb 256 with 128 tokens needs [0-9]+ MiB, more than half of this machine's"
               LABELS unit COMMAND $<TARGET_FILE:tpserve> bench kernels --type f32 --rows 1048576 --cols 1048576)
tp_expect_test(cli.bench_kernels_bad_prefetch RC 2 REGEX "--prefetch l3 is not a level; use l1 or l2"
               LABELS unit COMMAND $<TARGET_FILE:tpserve> bench kernels --prefetch l3)
tp_expect_test(cli.launch_shm_contradiction RC 2 REGEX "--shm and --no-shm contradict each other"
               LABELS unit COMMAND $<TARGET_FILE:tpserve> launch -n 2 --shm --no-shm -- true)
tp_expect_test(cli.bench_gen_bw_past_memory RC 2 REGEX "--bw-mib 1048576 needs 1048576 MiB, more than half of this machine's"
               LABELS unit COMMAND $<TARGET_FILE:tpserve> bench gen -m ${PROJECT_SOURCE_DIR}/models/stories260K.gguf --bw-mib 1048576)
