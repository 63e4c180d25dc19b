// SPDX-License-Identifier: Apache-2.0
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "roles/roles_impl.h"

static void assert_status(pcp_status_t status, pcp_status_code_t code,
                          const char* substring) {
  assert_non_null(status);
  assert_int_equal(pcp_status_code(status), code);
  if (!strstr(pcp_status_message(status), substring)) {
    fail_msg("message '%s' lacks '%s'", pcp_status_message(status), substring);
  }
  pcp_status_ignore(status);
}

//===----------------------------------------------------------------------===//
// A fake environment
//===----------------------------------------------------------------------===//

typedef struct fake_env_t {
  const char* pairs[32];  // name, value, name, value, ..., NULL
} fake_env_t;

static const char* fake_getenv(void* user_data, const char* name) {
  fake_env_t* env = user_data;
  for (size_t i = 0; env->pairs[i]; i += 2) {
    if (strcmp(env->pairs[i], name) == 0) {
      return env->pairs[i + 1];
    }
  }
  return NULL;
}

static char* worker_id(const char* backend, const char* target, int64_t device,
                       fake_env_t* env) {
  char* id = NULL;
  PCP_CHECK_OK(pcp_roles_worker_id_build(backend, target, device, fake_getenv,
                                         env, &id));
  return id;
}

#define ASSERT_WORKER_ID(expected, backend, target, device, ...) \
  do {                                                           \
    fake_env_t env_ = {{__VA_ARGS__}};                           \
    char* id_ = worker_id((backend), (target), (device), &env_); \
    assert_string_equal(id_, (expected));                        \
    free(id_);                                                   \
  } while (0)

//===----------------------------------------------------------------------===//
// Worker id
//===----------------------------------------------------------------------===//

static void worker_id_defaults(void** state) {
  (void)state;
  ASSERT_WORKER_ID(
      "local-default-unknown-node-unknown-pod-cpu-default-device-0", "cpu",
      NULL, 0, NULL);
  ASSERT_WORKER_ID(
      "local-default-unknown-node-unknown-pod-cpu-default-device-3", "cpu",
      NULL, 3, NULL);
}

static void worker_id_upstream_example(void** state) {
  (void)state;
  ASSERT_WORKER_ID(
      "site-a-pcp-system-gpu-node-1-pcp-worker-0-cuda-sm_80-device-"
      "GPU-123",
      "cuda", "sm_80", 0, "PCP_SITE_ID", "site-a", "POD_NAMESPACE",
      "pcp-system", "NODE_NAME", "gpu-node-1", "POD_NAME", "pcp-worker-0",
      "CUDA_VISIBLE_DEVICES", "GPU-123", NULL);
}

static void worker_id_override_is_sanitized(void** state) {
  (void)state;
  ASSERT_WORKER_ID("my-worker_1.a", "cpu", NULL, 0, "PCP_WORKER_ID",
                   "  my worker_1.a\n", NULL);
  ASSERT_WORKER_ID("a-b-c--d", "cuda", "sm_80", 0, "PCP_WORKER_ID", "a/b:c@!d",
                   "PCP_SITE_ID", "ignored", NULL);
  // Set but blank: "unknown".
  ASSERT_WORKER_ID("unknown", "cpu", NULL, 0, "PCP_WORKER_ID", " \t ", NULL);
  // Non-ASCII bytes become one dash each.
  ASSERT_WORKER_ID("caf--", "cpu", NULL, 0, "PCP_WORKER_ID", "caf\xc3\xa9",
                   NULL);
}

static void worker_id_components_are_sanitized(void** state) {
  (void)state;
  ASSERT_WORKER_ID("site-1-unknown-node-x-y-pod-rocm-gfx942-device-7", "rocm",
                   "gfx942", 7, "PCP_SITE_ID", " site 1 ", "POD_NAMESPACE", "",
                   "NODE_NAME", "node", "POD_NAME", "x/y:pod", NULL);
  ASSERT_WORKER_ID(
      "local-default-unknown-node-unknown-pod-cuda-sm-90a-device-0", "cuda",
      "sm 90a", 0, NULL);
}

static void worker_id_visible_devices(void** state) {
  (void)state;
  // Empty entries and -1 are skipped; the index counts what remains.
  ASSERT_WORKER_ID(
      "local-default-unknown-node-unknown-pod-cuda-default-device-5", "cuda",
      NULL, 1, "CUDA_VISIBLE_DEVICES", " 2, ,-1, 5 ,7", NULL);
  // No such entry: the decimal device id.
  ASSERT_WORKER_ID(
      "local-default-unknown-node-unknown-pod-cuda-default-device-4", "cuda",
      NULL, 4, "CUDA_VISIBLE_DEVICES", "0,1", NULL);
  // cpu ignores CUDA_VISIBLE_DEVICES.
  ASSERT_WORKER_ID(
      "local-default-unknown-node-unknown-pod-cpu-default-device-0", "cpu",
      NULL, 0, "CUDA_VISIBLE_DEVICES", "GPU-9", NULL);
  // rocm: HIP, then ROCR, then GPU_DEVICE_ORDINAL; the first set one wins,
  // even when it is empty.
  ASSERT_WORKER_ID(
      "local-default-unknown-node-unknown-pod-rocm-default-device-h1", "rocm",
      NULL, 0, "HIP_VISIBLE_DEVICES", "h1", "ROCR_VISIBLE_DEVICES", "r1", NULL);
  ASSERT_WORKER_ID(
      "local-default-unknown-node-unknown-pod-rocm-default-device-r2", "rocm",
      NULL, 1, "ROCR_VISIBLE_DEVICES", "r1,r2", "GPU_DEVICE_ORDINAL", "g1,g2",
      NULL);
  ASSERT_WORKER_ID(
      "local-default-unknown-node-unknown-pod-rocm-default-device-g1", "rocm",
      NULL, 0, "GPU_DEVICE_ORDINAL", "g1", NULL);
  ASSERT_WORKER_ID(
      "local-default-unknown-node-unknown-pod-rocm-default-device-0", "rocm",
      NULL, 0, "HIP_VISIBLE_DEVICES", "", "ROCR_VISIBLE_DEVICES", "r1", NULL);
  // Visible-device tokens are sanitized too.
  ASSERT_WORKER_ID(
      "local-default-unknown-node-unknown-pod-cuda-default-device-"
      "MIG-a-b",
      "cuda", NULL, 0, "CUDA_VISIBLE_DEVICES", "MIG-a/b", NULL);
}

static void worker_id_is_bounded(void** state) {
  (void)state;
  char* huge = malloc(8192);
  memset(huge, 'x', 8191);
  huge[8191] = 0;
  fake_env_t env = {{"PCP_WORKER_ID", huge, NULL}};
  char* id = NULL;
  assert_status(
      pcp_roles_worker_id_build("cpu", NULL, 0, fake_getenv, &env, &id),
      PCP_STATUS_RESOURCE_EXHAUSTED, "");
  assert_null(id);
  free(huge);
}

//===----------------------------------------------------------------------===//
// Role selection and legacy flags
//===----------------------------------------------------------------------===//

static pcp_status_t select_role(pcp_roles_role_t* role, int argc, ...) {
  char* argv[16];
  va_list args;
  va_start(args, argc);
  for (int i = 0; i < argc; ++i) {
    argv[i] = va_arg(args, char*);
  }
  va_end(args);
  return pcp_roles_role_select(argc, argv, role);
}

static void role_selection(void** state) {
  (void)state;
  pcp_roles_role_t role;
  assert_null(select_role(&role, 0));
  assert_int_equal(role, PCP_ROLES_ROLE_GATEWAY);
  assert_null(select_role(&role, 2, "--gateway-config", "f.json"));
  assert_int_equal(role, PCP_ROLES_ROLE_GATEWAY);
  assert_null(select_role(&role, 1, "--federation-hub"));
  assert_int_equal(role, PCP_ROLES_ROLE_FEDERATION_HUB);
  assert_null(select_role(&role, 2, "--port", "1", "--worker"));
  assert_null(select_role(&role, 3, "--port", "1", "--worker"));
  assert_int_equal(role, PCP_ROLES_ROLE_WORKER);
  assert_null(select_role(&role, 2, "--connect", "h:1"));
  assert_int_equal(role, PCP_ROLES_ROLE_WORKER);
  assert_null(select_role(&role, 1, "--connect=h:1"));
  assert_int_equal(role, PCP_ROLES_ROLE_WORKER);
  assert_null(select_role(&role, 1, "--node-manager"));
  assert_int_equal(role, PCP_ROLES_ROLE_NODE_MANAGER);
  assert_null(select_role(&role, 2, "--worker", "--worker"));
  assert_int_equal(role, PCP_ROLES_ROLE_WORKER);
  // --supervise wins over any mode flag, before or after it.
  assert_null(
      select_role(&role, 4, "--node-manager", "--supervise", "--", "--worker"));
  assert_int_equal(role, PCP_ROLES_ROLE_SUPERVISE);
  // Nothing after a bare `--` selects anything.
  assert_null(select_role(&role, 2, "--", "--worker"));
  assert_int_equal(role, PCP_ROLES_ROLE_GATEWAY);
  assert_status(select_role(&role, 2, "--worker", "--gateway"),
                PCP_STATUS_INVALID_ARGUMENT,
                "conflicting role flags '--worker' and '--gateway'");
  assert_string_equal(pcp_roles_role_name(PCP_ROLES_ROLE_NODE_MANAGER),
                      "node-manager");
}

static void legacy_flags_fail_with_hints(void** state) {
  (void)state;
  static const char* const kLegacy[] = {
      "--shepherd",  "--inference", "--config", "--inference-config",
      "--model",     "--resume",    "--rl",     "--no-dashboard",
      "--terminate", "--streaming"};
  for (size_t i = 0; i < PCP_ARRAYSIZE(kLegacy); ++i) {
    char* argv[] = {"--worker", (char*)kLegacy[i]};
    pcp_status_t status = pcp_roles_legacy_flags_check(2, argv);
    assert_non_null(status);
    assert_non_null(strstr(pcp_status_message(status), kLegacy[i]));
    assert_non_null(strstr(pcp_status_message(status), "was removed"));
    pcp_status_ignore(status);
  }
  char* with_value[] = {"--config=x.json"};
  assert_status(pcp_roles_legacy_flags_check(1, with_value),
                PCP_STATUS_INVALID_ARGUMENT,
                "controllers.training.config_path");
  // Prefixes of other flags are not legacy flags.
  char* fine[] = {"--rl-thing", "--configure", "--", "--rl"};
  assert_null(pcp_roles_legacy_flags_check(4, fine));
}

//===----------------------------------------------------------------------===//
// Flag tables
//===----------------------------------------------------------------------===//

static pcp_status_t parse_table(const pcp_config_table_t* table, void* config,
                                int argc, ...) {
  char* argv[16];
  va_list args;
  va_start(args, argc);
  for (int i = 0; i < argc; ++i) {
    argv[i] = va_arg(args, char*);
  }
  va_end(args);
  PCP_CHECK_OK(pcp_config_initialize(table, config));
  pcp_status_t status = pcp_config_parse_argv(table, argc, argv, config, NULL);
  if (!status) {
    status = pcp_config_validate(table, config);
  }
  return status;
}

static void worker_flags(void** state) {
  (void)state;
  pcp_roles_worker_config_t w;
  memset(&w, 0, sizeof(w));
  assert_null(parse_table(&pcp_roles_worker_table, &w, 0));
  assert_string_equal(w.host, "127.0.0.1");
  assert_int_equal(w.port, 8080);
  assert_string_equal(pcp_roles_backend_name(w.backend), "cpu");
  assert_int_equal(w.device_id, 0);
  assert_int_equal(w.supervisor_id, -1);
  assert_null(w.target);
  pcp_config_deinitialize(&pcp_roles_worker_table, &w);

  assert_null(parse_table(&pcp_roles_worker_table, &w, 11, "--worker", "--host",
                          "10.0.0.2", "--port=9000", "--backend", "cuda",
                          "--target", "sm_80", "--device-id", "3",
                          "--supervisor-id=4"));
  assert_string_equal(w.host, "10.0.0.2");
  assert_int_equal(w.port, 9000);
  assert_string_equal(pcp_roles_backend_name(w.backend), "cuda");
  assert_string_equal(w.target, "sm_80");
  assert_int_equal(w.device_id, 3);
  assert_int_equal(w.supervisor_id, 4);
  pcp_config_deinitialize(&pcp_roles_worker_table, &w);

  assert_status(parse_table(&pcp_roles_worker_table, &w, 2, "--port", "http"),
                PCP_STATUS_INVALID_ARGUMENT,
                "flag '--port': expected an integer, got 'http'");
  pcp_config_deinitialize(&pcp_roles_worker_table, &w);
  assert_status(parse_table(&pcp_roles_worker_table, &w, 2, "--port", "65536"),
                PCP_STATUS_INVALID_ARGUMENT, "out of range [1, 65535]");
  pcp_config_deinitialize(&pcp_roles_worker_table, &w);
  assert_status(parse_table(&pcp_roles_worker_table, &w, 2, "--backend", "tpu"),
                PCP_STATUS_INVALID_ARGUMENT,
                "(allowed: auto, cpu, cuda, metal, vulkan, rocm)");
  pcp_config_deinitialize(&pcp_roles_worker_table, &w);
  // Flags of other roles are unknown here.
  assert_status(parse_table(&pcp_roles_worker_table, &w, 2, "--api-port", "1"),
                PCP_STATUS_INVALID_ARGUMENT, "unknown flag '--api-port'");
  pcp_config_deinitialize(&pcp_roles_worker_table, &w);
  assert_status(parse_table(&pcp_roles_worker_table, &w, 1, "--gateway"),
                PCP_STATUS_INVALID_ARGUMENT, "unknown flag '--gateway'");
  pcp_config_deinitialize(&pcp_roles_worker_table, &w);
}

static void connect_parsing(void** state) {
  (void)state;
  char* host = strdup("127.0.0.1");
  int64_t port = 8080;
  assert_null(pcp_roles_connect_parse("gw.example:18080", &host, &port));
  assert_string_equal(host, "gw.example");
  assert_int_equal(port, 18080);
  assert_null(pcp_roles_connect_parse("other", &host, &port));
  assert_string_equal(host, "other");
  assert_int_equal(port, 18080);  // unchanged without a port
  assert_null(pcp_roles_connect_parse("[::1]:9000", &host, &port));
  assert_string_equal(host, "::1");
  assert_int_equal(port, 9000);
  assert_status(pcp_roles_connect_parse("h:0", &host, &port),
                PCP_STATUS_INVALID_ARGUMENT, "port '0' is not in [1, 65535]");
  assert_status(pcp_roles_connect_parse("h:x", &host, &port),
                PCP_STATUS_INVALID_ARGUMENT, "port 'x'");
  assert_status(pcp_roles_connect_parse("h:", &host, &port),
                PCP_STATUS_INVALID_ARGUMENT, "port ''");
  assert_status(pcp_roles_connect_parse(":80", &host, &port),
                PCP_STATUS_INVALID_ARGUMENT, "no host");
  assert_status(pcp_roles_connect_parse("[::1", &host, &port),
                PCP_STATUS_INVALID_ARGUMENT, "missing ']'");
  assert_string_equal(host, "::1");  // failures leave the values alone
  assert_int_equal(port, 9000);
  free(host);
}

static void hub_and_nodemgr_flags(void** state) {
  (void)state;
  pcp_roles_hub_config_t hub;
  memset(&hub, 0, sizeof(hub));
  assert_null(parse_table(&pcp_roles_hub_table, &hub, 3, "--federation-hub",
                          "--api-token-env", "HUB_TOKEN"));
  assert_int_equal(hub.api_port, 8003);  // apart from 8000, 8002, 8080
  assert_string_equal(hub.api_token_env, "HUB_TOKEN");
  pcp_config_deinitialize(&pcp_roles_hub_table, &hub);
  // --gateway-port / --gateway-host are aliases; the last one given wins.
  assert_null(parse_table(&pcp_roles_hub_table, &hub, 6, "--api-port", "1",
                          "--gateway-port", "19010", "--gateway-host",
                          "0.0.0.0"));
  assert_int_equal(hub.api_port, 19010);
  assert_string_equal(hub.api_host, "0.0.0.0");
  pcp_config_deinitialize(&pcp_roles_hub_table, &hub);
  assert_status(
      parse_table(&pcp_roles_hub_table, &hub, 2, "--gateway-port", "x"),
      PCP_STATUS_INVALID_ARGUMENT, "flag '--gateway-port'");
  pcp_config_deinitialize(&pcp_roles_hub_table, &hub);

  pcp_roles_nodemgr_config_t nm;
  memset(&nm, 0, sizeof(nm));
  assert_null(parse_table(&pcp_roles_nodemgr_table, &nm, 5, "--node-manager",
                          "--scale", "4", "--backend", "rocm"));
  assert_int_equal(nm.scale, 4);
  assert_int_equal(nm.port, 8080);
  assert_int_equal(nm.api_port, 8002);  // not the gateway's 8000
  assert_int_equal(nm.http_header_timeout_ms, 10000);
  assert_int_equal(nm.http_max_connections_per_client, 256);
  pcp_config_deinitialize(&pcp_roles_nodemgr_table, &nm);
  assert_status(parse_table(&pcp_roles_nodemgr_table, &nm, 2,
                            "--http-header-timeout-ms", "5"),
                PCP_STATUS_INVALID_ARGUMENT, "out of range [100, 600000]");
  pcp_config_deinitialize(&pcp_roles_nodemgr_table, &nm);
  assert_status(parse_table(&pcp_roles_nodemgr_table, &nm, 2, "--scale", "0"),
                PCP_STATUS_INVALID_ARGUMENT, "out of range [1, 1024]");
  pcp_config_deinitialize(&pcp_roles_nodemgr_table, &nm);
}

static void supervise_child_args(void** state) {
  (void)state;
  pcp_string_list_t args = {0};
  assert_status(pcp_roles_supervise_child_check(&args),
                PCP_STATUS_INVALID_ARGUMENT, "must be a worker");
  PCP_CHECK_OK(pcp_string_list_append(&args, "--gateway"));
  assert_status(pcp_roles_supervise_child_check(&args),
                PCP_STATUS_INVALID_ARGUMENT, "must be a worker");
  pcp_string_list_deinitialize(&args);
  PCP_CHECK_OK(pcp_string_list_append(&args, "--worker"));
  PCP_CHECK_OK(pcp_string_list_append(&args, "--port"));
  PCP_CHECK_OK(pcp_string_list_append(&args, "99999"));
  assert_status(pcp_roles_supervise_child_check(&args),
                PCP_STATUS_INVALID_ARGUMENT,
                "supervisor child: flag '--port': 99999 is out of range");
  pcp_string_list_deinitialize(&args);
  PCP_CHECK_OK(pcp_string_list_append(&args, "--worker"));
  PCP_CHECK_OK(pcp_string_list_append(&args, "--rl"));
  assert_status(pcp_roles_supervise_child_check(&args),
                PCP_STATUS_INVALID_ARGUMENT, "'--rl' was removed");
  pcp_string_list_deinitialize(&args);
  PCP_CHECK_OK(pcp_string_list_append(&args, "--connect"));
  PCP_CHECK_OK(pcp_string_list_append(&args, "gw:9000"));
  PCP_CHECK_OK(pcp_string_list_append(&args, "--device-id=1"));
  assert_null(pcp_roles_supervise_child_check(&args));
  pcp_string_list_deinitialize(&args);
}

//===----------------------------------------------------------------------===//
// Gateway config
//===----------------------------------------------------------------------===//

// Parses flags, writes |json| to a temp file as --gateway-config, and runs
// the gateway's prepare step. |config| is left for the caller to inspect
// and clean up with gateway_cleanup.
static pcp_status_t gateway_load(pcp_roles_gateway_config_t* config,
                                 const char* json, int argc, ...) {
  char* argv[16];
  va_list args;
  va_start(args, argc);
  for (int i = 0; i < argc; ++i) {
    argv[i] = va_arg(args, char*);
  }
  va_end(args);
  char path[] = "/tmp/pcp_gateway_config_XXXXXX";
  int fd = mkstemp(path);
  PCP_ASSERT(fd >= 0);
  PCP_ASSERT(write(fd, json, strlen(json)) == (ssize_t)strlen(json));
  close(fd);
  memset(config, 0, sizeof(*config));
  PCP_CHECK_OK(pcp_config_initialize(&pcp_roles_gateway_table, config));
  pcp_status_t status =
      pcp_config_parse_argv(&pcp_roles_gateway_table, argc, argv, config, NULL);
  if (!status) {
    status = pcp_config_set(&pcp_roles_gateway_table, config, "gateway-config",
                            path);
  }
  if (!status) {
    status = pcp_config_validate(&pcp_roles_gateway_table, config);
  }
  if (!status) {
    status = pcp_roles_gateway_prepare_config(config);
  }
  unlink(path);
  return status;
}

static void gateway_cleanup(pcp_roles_gateway_config_t* config) {
  if (config->file_loaded) {
    pcp_config_deinitialize(&pcp_roles_gateway_file_table, &config->file);
    pcp_config_deinitialize(&pcp_roles_gateway_effective_table,
                            &config->effective);
  }
  pcp_config_deinitialize(&pcp_roles_gateway_table, config);
}

static const char kFullConfig[] =
    "{\n"
    "  \"gateway_id\": \"site-a-gw\", \"lab_id\": \"site-a\",\n"
    "  \"graph_backend\": \"memory\",\n"
    "  \"policy_store_path\": \"/var/lib/pcp/graph-policies.json\",\n"
    "  \"neo4j\": null,\n"
    "  \"api\": {\"token_env\": \"PCP_GATEWAY_API_TOKEN\",\n"
    "          \"internal_token_env\": \"PCP_GATEWAY_INTERNAL_TOKEN\"},\n"
    "  \"federation\": {\"enabled\": true, \"upstream\": "
    "\"http://10.0.0.5:19010\",\n"
    "                 \"token_env\": \"PCP_FEDERATION_HUB_TOKEN\",\n"
    "                 \"heartbeat_interval_ms\": 5000},\n"
    "  \"worker_fabric\": {\"host\": \"0.0.0.0\", \"port\": 18080},\n"
    "  \"sharing_defaults\": {\"default_visibility\": \"local\"},\n"
    "  \"controllers\": {\n"
    "    \"training\": {\"enabled\": true, \"config_path\": "
    "\"/etc/pcp/train.json\",\n"
    "      \"service_id\": \"training-main\", \"workers\": 2, "
    "\"should_resume\": false,\n"
    "      \"worker_class\": \"cuda\", \"target_arch\": \"sm_80\",\n"
    "      \"reserved_workers\": 0, \"max_workers\": 4,\n"
    "      \"api\": {\"host\": \"127.0.0.1\", \"port\": 18100}},\n"
    "    \"inference\": {\"enabled\": true, \"config_path\": "
    "\"/etc/pcp/infer.json\",\n"
    "      \"service_id\": \"inference-main\", \"worker_class\": \"cuda\",\n"
    "      \"max_workers\": 2, \"reserved_workers\": 1,\n"
    "      \"api\": {\"host\": \"127.0.0.1\", \"port\": 18101}},\n"
    "    \"rl\": {\"enabled\": false, \"config_path\": \"/etc/pcp/rl.json\", "
    "\"backend\": \"cuda\"}\n"
    "  }\n"
    "}\n";

static void gateway_full_example_loads(void** state) {
  (void)state;
  pcp_roles_gateway_config_t c;
  assert_null(gateway_load(&c, kFullConfig, 0));
  assert_string_equal(c.file.gateway_id, "site-a-gw");
  assert_string_equal(c.file.lab_id, "site-a");
  assert_false(c.file.neo4j.present);
  assert_true(c.file.federation.enabled);
  assert_int_equal(c.file.worker_fabric.port, 18080);
  assert_true(c.file.controllers.training.enabled);
  assert_int_equal(c.file.controllers.training.max_workers, 4);
  assert_false(c.file.controllers.rl.enabled);
  assert_string_equal(c.file.controllers.rl.service_id, "rl-main");
  assert_string_equal(c.effective.api_token_env, "PCP_GATEWAY_API_TOKEN");
  assert_string_equal(c.effective.internal_api_token_env,
                      "PCP_GATEWAY_INTERNAL_TOKEN");
  assert_string_equal(c.effective.federation_upstream, "http://10.0.0.5:19010");
  assert_string_equal(c.effective.worker_fabric_host, "0.0.0.0");
  assert_int_equal(c.effective.worker_fabric_port, 18080);
  assert_int_equal(c.effective.controllers.count, 2);
  assert_string_equal(c.effective.controllers.items[0],
                      "inference@127.0.0.1:18101");
  assert_string_equal(c.effective.controllers.items[1],
                      "training@127.0.0.1:18100");
  gateway_cleanup(&c);
}

static void gateway_minimal_and_precedence(void** state) {
  (void)state;
  pcp_roles_gateway_config_t c;
  // The shipped minimal config: top-level token envs, legacy endpoint.
  assert_null(gateway_load(
      &c,
      "{\"gateway_id\": \"lab-alpha-gateway\", \"lab_id\": \"lab-alpha\","
      " \"graph_backend\": \"memory\", \"federation_hub_endpoint\": null,"
      " \"federation\": {\"enabled\": false, \"token_env\": "
      "\"PCP_FEDERATION_HUB_TOKEN\", \"heartbeat_interval_ms\": 5000},"
      " \"api_token_env\": \"PCP_GATEWAY_API_TOKEN\","
      " \"internal_api_token_env\": \"PCP_GATEWAY_INTERNAL_TOKEN\"}",
      4, "--control-port", "9100", "--api-port", "9000"));
  assert_string_equal(c.effective.api_token_env, "PCP_GATEWAY_API_TOKEN");
  assert_null(c.effective.federation_upstream);
  assert_string_equal(c.effective.worker_fabric_host, "127.0.0.1");
  assert_int_equal(c.effective.worker_fabric_port, 9100);
  assert_int_equal(c.effective.api_port, 9000);
  assert_int_equal(c.effective.controllers.count, 0);
  gateway_cleanup(&c);
  // --api-token-env beats both config forms; api.* beats the top level;
  // federation.upstream beats federation_hub_endpoint.
  assert_null(gateway_load(
      &c,
      "{\"gateway_id\": \"g\", \"lab_id\": \"l\", \"api_token_env\": \"TOP\","
      " \"internal_api_token_env\": \"ITOP\", \"api\": {\"token_env\": "
      "\"NESTED\", \"internal_token_env\": \"INESTED\"},"
      " \"federation_hub_endpoint\": \"http://old\","
      " \"federation\": {\"upstream\": \"http://new\"}}",
      2, "--api-token-env", "FLAG"));
  assert_string_equal(c.effective.api_token_env, "FLAG");
  assert_string_equal(c.effective.internal_api_token_env, "INESTED");
  assert_string_equal(c.effective.federation_upstream, "http://new");
  assert_int_equal(c.effective.federation_heartbeat_interval_ms, 5000);
  gateway_cleanup(&c);
  assert_null(gateway_load(&c,
                           "{\"gateway_id\": \"g\", \"lab_id\": \"l\","
                           " \"api\": {\"token_env\": \"NESTED\"},"
                           " \"api_token_env\": \"TOP\"}",
                           0));
  assert_string_equal(c.effective.api_token_env, "NESTED");
  gateway_cleanup(&c);
  // The http limits object (issue 13): parsed as given, absent keys 0 (the
  // http module's defaults).
  assert_null(gateway_load(&c,
                           "{\"gateway_id\": \"g\", \"lab_id\": \"l\","
                           " \"http\": {\"header_timeout_ms\": 2000,"
                           " \"max_connections\": 4096}}",
                           0));
  assert_true(c.file.http.present);
  assert_int_equal(c.file.http.header_timeout_ms, 2000);
  assert_int_equal(c.file.http.max_connections, 4096);
  assert_int_equal(c.file.http.max_connections_per_client, 0);
  assert_int_equal(c.file.http.idle_timeout_s, 0);
  gateway_cleanup(&c);
}

static void gateway_config_errors_name_the_key(void** state) {
  (void)state;
  static const struct {
    const char* json;
    const char* message;
  } kCases[] = {
      {"{\"lab_id\": \"l\"}", "missing required key 'gateway_id'"},
      {"{\"gateway_id\": \"g\"}", "missing required key 'lab_id'"},
      {"{\"gateway_id\": 5, \"lab_id\": \"l\"}",
       "key 'gateway_id': expected a string, got a number"},
      {"{\"gateway_id\": \"g\", \"lab_id\": \"l\", \"graph_backend\": "
       "\"sql\"}",
       "key 'graph_backend': invalid value 'sql' (allowed: memory, sqlite, "
       "falkordb)"},
      {"{\"gateway_id\": \"g\", \"lab_id\": \"l\", \"graph_backend\": "
       "\"neo4j\", \"neo4j\": {\"uri\": \"bolt://h\", \"user\": \"u\"}}",
       "key 'graph_backend': invalid value 'neo4j' (allowed: memory, sqlite, "
       "falkordb)"},
      {"{\"gateway_id\": \"g\", \"lab_id\": \"l\", \"graph_backend\": "
       "\"falkordb\", \"falkordb\": {\"port\": 0}}",
       "key 'falkordb.port': 0 is out of range"},
      {"{\"gateway_id\": \"g\", \"lab_id\": \"l\", "
       "\"neo4j\": {\"uri\": \"bolt://h:7687\"}}",
       "missing required key 'neo4j.user'"},
      {"{\"gateway_id\": \"g\", \"lab_id\": \"l\", \"neo4j\": {\"uri\": "
       "\"bolt://h\", \"user\": \"u\", \"query_timeout_ms\": -1}}",
       "key 'neo4j.query_timeout_ms': -1 is out of range"},
      {"{\"gateway_id\": \"g\", \"lab_id\": \"l\", \"federation\": "
       "{\"enabled\": true}}",
       "'federation.enabled' is true but neither"},
      {"{\"gateway_id\": \"g\", \"lab_id\": \"l\", \"worker_fabric\": "
       "{\"port\": 70000}}",
       "key 'worker_fabric.port': 70000 is out of range [1, 65535]"},
      {"{\"gateway_id\": \"g\", \"lab_id\": \"l\", \"http\": "
       "{\"header_timeout_ms\": 50}}",
       "key 'http.header_timeout_ms': 50 is out of range [100, 600000]"},
      {"{\"gateway_id\": \"g\", \"lab_id\": \"l\", \"http\": "
       "{\"max_connections_per_client\": 0}}",
       "key 'http.max_connections_per_client': 0 is out of range"},
      {"{\"gateway_id\": \"g\", \"lab_id\": \"l\", \"sharing_defaults\": "
       "{\"default_visibility\": \"public\"}}",
       "key 'sharing_defaults.default_visibility': invalid value 'public' "
       "(allowed: local, shared, global)"},
      {"{\"gateway_id\": \"g\", \"lab_id\": \"l\", \"controllers\": "
       "{\"training\": {\"enabled\": true}}}",
       "key 'controllers.training.config_path' is required when"},
      {"{\"gateway_id\": \"g\", \"lab_id\": \"l\", \"controllers\": "
       "{\"rl\": {\"enabled\": true, \"config_path\": \"r\", "
       "\"worker_class\": \"tpu\"}}}",
       "key 'controllers.rl.worker_class': invalid value 'tpu'"},
      {"{\"gateway_id\": \"g\", \"lab_id\": \"l\", \"controllers\": "
       "{\"inference\": {\"enabled\": true, \"config_path\": \"i\", "
       "\"target_arch\": \"\"}}}",
       "key 'controllers.inference.target_arch' is empty"},
      {"{\"gateway_id\": \"g\", \"lab_id\": \"l\", \"controllers\": "
       "{\"training\": {\"enabled\": true, \"config_path\": \"t\", "
       "\"reserved_workers\": 3, \"max_workers\": 2}}}",
       "'controllers.training.reserved_workers' (3) exceeds"},
      {"{\"gateway_id\": \"g\", \"lab_id\": \"l\", \"controllers\": "
       "{\"training\": {\"enabled\": true, \"config_path\": \"t\", "
       "\"max_workers\": 1}}}",
       "controllers.training needs 2 workers but "
       "'controllers.training.max_workers' is 1"},
      {"{\"gateway_id\": \"g\", \"lab_id\": \"l\", \"controllers\": "
       "{\"training\": {\"enabled\": true, \"config_path\": \"t\"},"
       " \"rl\": {\"enabled\": true, \"config_path\": \"r\"}}}",
       "controllers.rl would listen on port 8001, already used by training"},
      {"{\"gateway_id\": \"g\", \"lab_id\": \"l\", \"controllers\": "
       "{\"training\": {\"enabled\": true, \"config_path\": \"t\", \"api\": "
       "{\"port\": 8080}}}}",
       "already used by the worker fabric"},
      {"{\"gateway_id\": \"g\", \"lab_id\": \"l\", \"controllers\": []}",
       "key 'controllers': expected an object, got an array"},
      {"[]", "expected a JSON object at the top level"},
      {"{\"gateway_id\": \"g\",", "invalid JSON at line 1"},
  };
  for (size_t i = 0; i < PCP_ARRAYSIZE(kCases); ++i) {
    pcp_roles_gateway_config_t c;
    pcp_status_t status = gateway_load(&c, kCases[i].json, 0);
    if (!status) {
      fail_msg("case %zu loaded: %s", i, kCases[i].json);
    }
    if (!strstr(pcp_status_message(status), kCases[i].message)) {
      fail_msg("case %zu: '%s' lacks '%s'", i, pcp_status_message(status),
               kCases[i].message);
    }
    assert_non_null(strstr(pcp_status_message(status), "gateway config"));
    pcp_status_ignore(status);
    gateway_cleanup(&c);
  }
}

static void gateway_disabled_controller_and_unknown_keys(void** state) {
  (void)state;
  pcp_roles_gateway_config_t c;
  // A disabled block is not checked; unknown keys are accepted.
  assert_null(gateway_load(
      &c,
      "{\"gateway_id\": \"g\", \"lab_id\": \"l\", \"future_key\": 1,"
      " \"controllers\": {\"rl\": {\"enabled\": false, \"worker_class\": "
      "\"bogus\"}, \"extensions\": {\"x\": 1}}}",
      0));
  assert_int_equal(c.effective.controllers.count, 0);
  gateway_cleanup(&c);
}

static void gateway_missing_file(void** state) {
  (void)state;
  pcp_roles_gateway_config_t c;
  memset(&c, 0, sizeof(c));
  PCP_CHECK_OK(pcp_config_initialize(&pcp_roles_gateway_table, &c));
  assert_status(pcp_config_validate(&pcp_roles_gateway_table, &c),
                PCP_STATUS_INVALID_ARGUMENT,
                "missing required flag '--gateway-config'");
  PCP_CHECK_OK(pcp_config_set(&pcp_roles_gateway_table, &c, "gateway-config",
                              "/nonexistent/gw.json"));
  assert_status(pcp_roles_gateway_prepare_config(&c), PCP_STATUS_NOT_FOUND,
                "flag '--gateway-config': opening '/nonexistent/gw.json'");
  gateway_cleanup(&c);
}

// Seeded mutations of the full example through the gateway's file tables:
// every input either loads or fails with a message, never crashes (run
// under ASan this also checks every error path for leaks and overflows).
static void gateway_config_survives_mutations(void** state) {
  (void)state;
  static const char* const kTokens[] = {
      "{",     "}",           "[",
      "]",     "\"",          ",",
      ":",     "null",        "-1",
      "1e309", "0.5",         "99999999999999999999",
      "true",  "\"\\u0000\"", "\"controllers\""};
  pcp_rng_t rng;
  pcp_rng_initialize(0x5eed, &rng);
  const size_t base_length = strlen(kFullConfig);
  char* text = malloc(base_length * 4 + 64);
  size_t loaded = 0;
  for (int iteration = 0; iteration < 4000; ++iteration) {
    memcpy(text, kFullConfig, base_length + 1);
    size_t length = base_length;
    int mutations = 1 + (int)pcp_rng_next_below(&rng, 4);
    for (int m = 0; m < mutations && length > 0; ++m) {
      size_t at = (size_t)pcp_rng_next_below(&rng, length);
      switch (pcp_rng_next_below(&rng, 4)) {
        case 0:  // overwrite one byte with anything
          text[at] = (char)pcp_rng_next_below(&rng, 256);
          break;
        case 1: {  // delete a range
          size_t n = 1 + (size_t)pcp_rng_next_below(&rng, 16);
          if (n > length - at) {
            n = length - at;
          }
          memmove(text + at, text + at + n, length - at - n + 1);
          length -= n;
          break;
        }
        case 2: {  // insert a token
          const char* token =
              kTokens[pcp_rng_next_below(&rng, PCP_ARRAYSIZE(kTokens))];
          size_t n = strlen(token);
          if (length + n > base_length * 4) {
            break;
          }
          memmove(text + at + n, text + at, length - at + 1);
          memcpy(text + at, token, n);
          length += n;
          break;
        }
        default:  // truncate
          length = at;
          text[length] = 0;
          break;
      }
    }
    pcp_roles_gateway_file_config_t file;
    memset(&file, 0, sizeof(file));
    PCP_CHECK_OK(pcp_config_initialize(&pcp_roles_gateway_file_table, &file));
    pcp_string_list_t unknown = {0};
    pcp_status_t status = pcp_config_parse_json(&pcp_roles_gateway_file_table,
                                                text, length, &file, &unknown);
    if (!status) {
      status = pcp_config_validate(&pcp_roles_gateway_file_table, &file);
    }
    if (status) {
      pcp_status_code_t code = pcp_status_code(status);
      assert_true(code == PCP_STATUS_INVALID_ARGUMENT ||
                  code == PCP_STATUS_RESOURCE_EXHAUSTED);
      assert_true(strlen(pcp_status_message(status)) > 0);
      pcp_status_ignore(status);
    } else {
      ++loaded;
    }
    pcp_string_list_deinitialize(&unknown);
    pcp_config_deinitialize(&pcp_roles_gateway_file_table, &file);
  }
  free(text);
  // Some mutations are harmless (inside strings): both paths ran.
  assert_true(loaded > 0);
  assert_true(loaded < 4000);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(worker_id_defaults),
      cmocka_unit_test(worker_id_upstream_example),
      cmocka_unit_test(worker_id_override_is_sanitized),
      cmocka_unit_test(worker_id_components_are_sanitized),
      cmocka_unit_test(worker_id_visible_devices),
      cmocka_unit_test(worker_id_is_bounded),
      cmocka_unit_test(role_selection),
      cmocka_unit_test(legacy_flags_fail_with_hints),
      cmocka_unit_test(worker_flags),
      cmocka_unit_test(connect_parsing),
      cmocka_unit_test(hub_and_nodemgr_flags),
      cmocka_unit_test(supervise_child_args),
      cmocka_unit_test(gateway_full_example_loads),
      cmocka_unit_test(gateway_minimal_and_precedence),
      cmocka_unit_test(gateway_config_errors_name_the_key),
      cmocka_unit_test(gateway_disabled_controller_and_unknown_keys),
      cmocka_unit_test(gateway_missing_file),
      cmocka_unit_test(gateway_config_survives_mutations),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
