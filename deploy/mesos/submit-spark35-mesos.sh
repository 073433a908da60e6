#!/usr/bin/env bash
# Legacy path: run the bookie-cluster application on *native* Mesos with Spark 3.5
# (`--master mesos://zk://...`). Spark 4 removed the Mesos scheduler, so this needs a Spark 3.5
# spark-submit and libmesos on the submitting host; the hosting job uses only APIs that Spark 3.5
# also has. On DC/OS with Spark 4, use the Marathon group instead (README.md in this folder).
#
# Usage:
#   submit-spark35-mesos.sh --mesos-master mesos://zk://ZK1:2181,ZK2:2181/mesos --zk ZK1:2181/spark-bookie/ledgers \
#       --bookies N [--data-root /var/lib/spark-bookie] [--name spark-bookie] [--base-port 3181] \
#       [--docker-image IMAGE] [--executor-cores 1] [--executor-memory 2g] [--block-manager-port 7079] \
#       [--task-max-failures 1000] [--job FILE] [--skip-init] [--dry-run] [-- EXTRA SPARK-SUBMIT ARGS...]
#
# Slot k's bookie listens on base-port + k on whichever agent runs it: keep that range free there.
#
# Environment: SPARK_SUBMIT (default: spark-submit on PATH; must be Spark 3.5), PYTHON (the Python that
# has spark-bookie installed; default python3), EXECUTOR_PYTHON (the same on the agents or in the
# executor image; default python3), MESOS_NATIVE_JAVA_LIBRARY (libmesos.so; Spark's Mesos backend loads
# it), SPARK_MESOS_ROLE / SPARK_MESOS_PRINCIPAL / SPARK_MESOS_SECRET (optional).
#
# --dry-run prints the commands it would run, one per line, shell-quoted, and runs nothing.
set -euo pipefail

die() { echo "submit-spark35-mesos: error: $*" >&2; exit 2; }

mesos_master="" zk="" bookies="" data_root="/var/lib/spark-bookie" image="" job="" name="spark-bookie"
base_port=3181 executor_cores=1 executor_memory="2g" block_manager_port=7079 task_max_failures=1000
dry_run=0 skip_init=0
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --mesos-master) mesos_master=${2:?}; shift 2 ;;
    --zk) zk=${2:?}; shift 2 ;;
    --bookies) bookies=${2:?}; shift 2 ;;
    --data-root) data_root=${2:?}; shift 2 ;;
    --name) name=${2:?}; shift 2 ;;
    --base-port) base_port=${2:?}; shift 2 ;;
    --docker-image) image=${2:?}; shift 2 ;;
    --executor-cores) executor_cores=${2:?}; shift 2 ;;
    --executor-memory) executor_memory=${2:?}; shift 2 ;;
    --block-manager-port) block_manager_port=${2:?}; shift 2 ;;
    --task-max-failures) task_max_failures=${2:?}; shift 2 ;;
    --job) job=${2:?}; shift 2 ;;
    --skip-init) skip_init=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

[ -n "$mesos_master" ] || die "--mesos-master is required (mesos://zk://HOST:2181/mesos or mesos://HOST:5050)"
[[ "$mesos_master" == mesos://* ]] || die "--mesos-master must start with mesos:// (got '$mesos_master')"
[ -n "$zk" ] || die "--zk is required: the bookie cluster's connect string, e.g. HOST:2181/spark-bookie/ledgers"
[[ "$bookies" =~ ^[1-9][0-9]*$ ]] || die "--bookies must be a positive integer (got '${bookies}')"
[[ "$executor_cores" =~ ^[1-9][0-9]*$ ]] || die "--executor-cores must be a positive integer (got '$executor_cores')"
[[ "$block_manager_port" =~ ^[1-9][0-9]*$ ]] || die "--block-manager-port must be a port number"
[[ "$base_port" =~ ^[1-9][0-9]*$ ]] && [ $((base_port + bookies - 1)) -le 65535 ] \
  || die "--base-port: the bookies need ports $base_port..$((base_port + bookies - 1)); none may be past 65535"
[[ "$task_max_failures" =~ ^[1-9][0-9]*$ ]] || die "--task-max-failures must be a positive integer"
[[ "$name" =~ ^[A-Za-z0-9._-]+$ ]] || die "--name must be one path component of letters, digits, . _ - (got '$name')"
[[ "$data_root" == /* ]] || die "--data-root must be an absolute path on every agent (got '$data_root')"

spark_submit=${SPARK_SUBMIT:-spark-submit}
python=${PYTHON:-python3}
executor_python=${EXECUTOR_PYTHON:-python3}

if [ "$dry_run" -eq 0 ]; then
  version=$("$spark_submit" --version 2>&1 | grep -Eo 'version [0-9]+\.[0-9]+\.[0-9]+' | head -n1 | cut -d' ' -f2 || true)
  case "$version" in
    3.5.*) ;;
    "") die "cannot run '$spark_submit --version'; set SPARK_SUBMIT to a Spark 3.5 spark-submit" ;;
    *) die "'$spark_submit' is Spark $version; the native Mesos master needs Spark 3.5 (Spark 4 has no Mesos scheduler). Use the Marathon group on DC/OS instead." ;;
  esac
  if [ -z "${MESOS_NATIVE_JAVA_LIBRARY:-}" ]; then
    for lib in /usr/lib/libmesos.so /usr/local/lib/libmesos.so; do
      if [ -e "$lib" ]; then export MESOS_NATIVE_JAVA_LIBRARY=$lib; break; fi
    done
  fi
  [ -n "${MESOS_NATIVE_JAVA_LIBRARY:-}" ] || echo "submit-spark35-mesos: warning: MESOS_NATIVE_JAVA_LIBRARY is unset and no libmesos.so was found; Spark's Mesos backend will fail to start" >&2
fi

if [ -z "$job" ]; then
  job=$("$python" -c 'import jobs.bookie_cluster as j; print(j.__file__)') \
    || die "cannot locate jobs/bookie_cluster.py with $python (is spark-bookie installed there? or pass --job FILE)"
fi

# Coarse-grained mode: executors are sized by spark.executor.cores and stop at spark.cores.max, so
# N bookies = N executors. A fixed spark.blockManager.port makes Spark's Mesos backend accept only
# offers holding that port, hence at most one executor (one bookie) per agent.
conf=(
  spark.mesos.coarse=true
  "spark.cores.max=$((bookies * executor_cores))"
  "spark.executor.cores=$executor_cores"
  "spark.executor.memory=$executor_memory"
  "spark.blockManager.port=$block_manager_port"
  spark.speculation=false
  spark.dynamicAllocation.enabled=false
  "spark.task.maxFailures=$task_max_failures"   # the job sets it too, from --task-max-failures
  "spark.pyspark.driver.python=$python"
  "spark.pyspark.python=$executor_python"
  "spark.executorEnv.SPARK_BOOKIE_ZK=$zk"
)
if [ -n "$image" ]; then
  conf+=("spark.mesos.executor.docker.image=$image" "spark.mesos.executor.docker.volumes=$data_root:$data_root:rw")
fi
[ -z "${SPARK_MESOS_ROLE:-}" ] || conf+=("spark.mesos.role=$SPARK_MESOS_ROLE")
[ -z "${SPARK_MESOS_PRINCIPAL:-}" ] || conf+=("spark.mesos.principal=$SPARK_MESOS_PRINCIPAL")
[ -z "${SPARK_MESOS_SECRET:-}" ] || conf+=("spark.mesos.secret=$SPARK_MESOS_SECRET")

submit=("$spark_submit" --master "$mesos_master" --deploy-mode client --name "$name")
for c in "${conf[@]}"; do submit+=(--conf "$c"); done
submit+=("${extra[@]}" "$job" --zk "$zk" --bookies "$bookies" --data-root "$data_root" --name "$name"
         --base-port "$base_port" --task-max-failures "$task_max_failures")
init=(spark-bookie init --zk "$zk")

if [ "$dry_run" -eq 1 ]; then
  quote() { printf '%q ' "$@" | sed 's/ $//'; echo; }
  [ "$skip_init" -eq 1 ] || quote "${init[@]}"
  quote "${submit[@]}"
  exit 0
fi
[ "$skip_init" -eq 1 ] || "${init[@]}"
exec "${submit[@]}"
