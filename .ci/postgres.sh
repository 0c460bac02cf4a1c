# Start a PostgreSQL server on loopback for the memory tests; meant to be `source`d by .ci/run (as root).
#
# Installs Debian's postgresql package if it is missing, starts the default cluster on 127.0.0.1:5432,
# creates the role `agent` (password `agent`) and the database `agent_test`, and prints the URL the tests
# read from AGENT_RUNTIME_TEST_PG_URL. It exports nothing and leaves the caller's shell options alone;
# it returns non-zero (and says why on stderr) if the server cannot be started.

agent_runtime_start_postgres() {
    local url="postgresql+psycopg://agent:agent@127.0.0.1:5432/agent_test"
    if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
        echo "postgres.sh: installing postgresql from Debian's packages" >&2
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >&2 \
            || { echo "postgres.sh: apt-get install postgresql failed" >&2; return 1; }
    fi
    local version
    version=$(ls /usr/lib/postgresql | sort -V | tail -1)
    if ! pg_lsclusters -h 2>/dev/null | grep -q "^$version main"; then
        pg_createcluster "$version" main >&2 || { echo "postgres.sh: pg_createcluster failed" >&2; return 1; }
    fi
    if ! pg_lsclusters -h | grep -q "^$version main .* online"; then
        pg_ctlcluster "$version" main start >&2 \
            || { echo "postgres.sh: could not start the $version/main cluster" >&2; return 1; }
    fi
    local i
    for i in $(seq 1 30); do
        su postgres -c "psql -qAtc 'select 1'" >/dev/null 2>&1 && break
        sleep 1
    done
    su postgres -c "psql -v ON_ERROR_STOP=1 -qAt" >&2 <<'SQL' || { echo "postgres.sh: could not create the role/database" >&2; return 1; }
DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'agent') THEN
    CREATE ROLE agent LOGIN PASSWORD 'agent' CREATEDB;
  END IF;
END $$;
SELECT 'CREATE DATABASE agent_test OWNER agent' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'agent_test')
\gexec
SQL
    echo "$url"
}

agent_runtime_start_postgres
