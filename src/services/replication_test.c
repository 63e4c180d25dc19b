// SPDX-License-Identifier: Apache-2.0
// Graph replication: policy eligibility, batching, the visibility filter,
// the local-first merge, event mutations, and the store's exactly-once
// batch apply with its durable ack (real SQLite in a temp dir).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "services/services.h"

#define EXPECT_OK(expr)                                       \
  do {                                                        \
    pcp_status_t status_ = (expr);                            \
    if (status_) {                                            \
      fail_msg("%s: %s", #expr, pcp_status_message(status_)); \
    }                                                         \
  } while (0)

static pcp_store_mutation_t entity(const char* id, const char* ns,
                                   pcp_store_visibility_t visibility) {
  pcp_store_mutation_t m = {.mutation_type = PCP_STORE_MUTATION_UPSERT_ENTITY,
                            .visibility = visibility};
  snprintf(m.mutation_id, sizeof(m.mutation_id), "m-%s", id);
  snprintf(m.namespace_id, sizeof(m.namespace_id), "%s", ns);
  snprintf(m.target_id, sizeof(m.target_id), "%s", id);
  return m;
}

static void eligibility(void** state) {
  (void)state;
  pcp_store_graph_policy_t policy;
  pcp_services_replication_policy_default("lab/a", PCP_STORE_VISIBILITY_GLOBAL,
                                          &policy);
  pcp_store_mutation_t m = entity("e1", "lab/a", PCP_STORE_VISIBILITY_GLOBAL);
  // Nothing replicates until a policy enables it (upstream s.6.5).
  assert_false(pcp_services_replication_eligible(&policy, &m));
  policy.allow_global_replication = true;
  assert_true(pcp_services_replication_eligible(&policy, &m));
  m.visibility = PCP_STORE_VISIBILITY_SHARED;
  assert_true(pcp_services_replication_eligible(&policy, &m));
  m.visibility = PCP_STORE_VISIBILITY_LOCAL;
  assert_false(pcp_services_replication_eligible(&policy, &m));
  // Observations carry raw payloads: they need the second flag too.
  m.visibility = PCP_STORE_VISIBILITY_GLOBAL;
  m.mutation_type = PCP_STORE_MUTATION_APPEND_OBSERVATION;
  assert_false(pcp_services_replication_eligible(&policy, &m));
  policy.allow_raw_payload_export = true;
  assert_true(pcp_services_replication_eligible(&policy, &m));
  // Policies travel as snapshots, never as items.
  m.mutation_type = PCP_STORE_MUTATION_POLICY_UPDATE;
  assert_false(pcp_services_replication_eligible(&policy, &m));
}

static void policy_update_validates(void** state) {
  (void)state;
  pcp_store_graph_policy_t policy;
  pcp_services_replication_policy_default("ns", PCP_STORE_VISIBILITY_LOCAL,
                                          &policy);
  json_t* update = json_pack("{s:s, s:b}", "default_visibility", "shared",
                             "allow_global_replication", 1);
  EXPECT_OK(pcp_services_replication_policy_update(update, false, &policy));
  json_decref(update);
  assert_int_equal(policy.default_visibility, PCP_STORE_VISIBILITY_SHARED);
  assert_true(policy.allow_global_replication);
  assert_false(policy.allow_raw_payload_export);  // untouched (partial)
  static const char* const kBad[] = {
      "{\"default_visibility\": \"public\"}",
      "{\"allow_global_replication\": \"yes\"}",
      "{\"allow_raw_payload_exports\": true}",
      "[]",
  };
  for (size_t i = 0; i < sizeof(kBad) / sizeof(kBad[0]); ++i) {
    json_t* bad = json_loads(kBad[i], JSON_DECODE_ANY, NULL);
    pcp_status_t status =
        pcp_services_replication_policy_update(bad, false, &policy);
    assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
    pcp_status_ignore(status);
    json_decref(bad);
  }
  // The refused updates changed nothing.
  assert_int_equal(policy.default_visibility, PCP_STORE_VISIBILITY_SHARED);
  assert_true(policy.allow_global_replication);
}

static void batching(void** state) {
  (void)state;
  // 200 records over two namespaces; only "open" replicates; every third
  // record is local.
  pcp_store_mutation_t items[200];
  for (int i = 0; i < 200; ++i) {
    char id[32];
    snprintf(id, sizeof(id), "e%d", i);
    items[i] = entity(
        id, i % 2 ? "closed" : "open",
        i % 3 == 0 ? PCP_STORE_VISIBILITY_LOCAL : PCP_STORE_VISIBILITY_GLOBAL);
    items[i].sequence_no = i + 1;
  }
  pcp_store_mutation_list_t page = {.items = items, .count = 200};
  pcp_store_graph_policy_t open = {.namespace_id = "open",
                                   .allow_global_replication = true};
  pcp_store_graph_policy_list_t policies = {.items = &open, .count = 1};
  size_t index = 0;
  int batches = 0;
  size_t total = 0;
  int64_t last_through = 0;
  while (index < page.count) {
    json_t *batch_items = NULL, *batch_policies = NULL;
    int64_t through = 0;
    EXPECT_OK(pcp_services_replication_batch_build(
        &page, &index, &policies, PCP_STORE_VISIBILITY_LOCAL, 64, 1 << 20,
        &batch_items, &batch_policies, &through));
    assert_true(json_array_size(batch_items) <= 64);
    assert_true(through > last_through);
    last_through = through;
    size_t i;
    json_t* item;
    json_array_foreach(batch_items, i, item) {
      pcp_store_mutation_t parsed;
      EXPECT_OK(pcp_services_replication_item_parse(item, &parsed));
      assert_string_equal(parsed.namespace_id, "open");
      assert_int_equal(parsed.visibility, PCP_STORE_VISIBILITY_GLOBAL);
      assert_true(parsed.sequence_no <= through);
      pcp_services_replication_item_deinitialize(&parsed);
    }
    if (json_array_size(batch_items)) {
      assert_int_equal(json_array_size(batch_policies), 1);
    }
    total += json_array_size(batch_items);
    ++batches;
    json_decref(batch_items);
    json_decref(batch_policies);
  }
  // Even i (open) and i % 3 != 0: 100 - 34 = 66 eligible -> 64 + 2.
  assert_int_equal(total, 66);
  assert_int_equal(batches, 2);
  assert_int_equal(last_through, 200);

  // A byte cap splits batches earlier but always sends one item.
  index = 0;
  json_t *batch_items = NULL, *batch_policies = NULL;
  int64_t through = 0;
  EXPECT_OK(pcp_services_replication_batch_build(
      &page, &index, &policies, PCP_STORE_VISIBILITY_LOCAL, 64, 1, &batch_items,
      &batch_policies, &through));
  assert_int_equal(json_array_size(batch_items), 1);
  json_decref(batch_items);
  json_decref(batch_policies);
}

static void filter_and_merge(void** state) {
  (void)state;
  json_t* local = json_loads(
      "{\"entities\": [{\"entity_id\": \"a\", \"visibility\": \"local\","
      " \"namespace_id\": \"n\", \"src\": \"local\"},"
      " {\"entity_id\": \"b\", \"visibility\": \"global\","
      " \"namespace_id\": \"n\", \"src\": \"local\"}],"
      " \"relations\": [], \"observations\": []}",
      0, NULL);
  json_t* global = json_loads(
      "{\"entities\": [{\"entity_id\": \"b\", \"visibility\": \"global\","
      " \"namespace_id\": \"n\", \"src\": \"hub\"},"
      " {\"entity_id\": \"c\", \"visibility\": \"shared\","
      " \"namespace_id\": \"n\", \"src\": \"hub\"},"
      " {\"entity_id\": \"d\", \"visibility\": \"local\","
      " \"namespace_id\": \"n\", \"src\": \"hub\"}],"
      " \"relations\": [], \"observations\": [{\"observation_id\": \"o\","
      " \"visibility\": \"global\", \"namespace_id\": \"n\"}]}",
      0, NULL);
  assert_non_null(local);
  assert_non_null(global);
  // Visibility alone: the hub's local item goes.
  pcp_services_replication_result_filter(global, NULL);
  assert_int_equal(json_array_size(json_object_get(global, "entities")), 2);
  json_t* merged = pcp_services_replication_result_merge(local, global, 0);
  json_t* entities = json_object_get(merged, "entities");
  assert_int_equal(json_array_size(entities), 3);  // a, b (local), c
  assert_string_equal(
      json_string_value(json_object_get(json_array_get(entities, 1), "src")),
      "local");
  assert_string_equal(json_string_value(json_object_get(
                          json_array_get(entities, 2), "entity_id")),
                      "c");
  json_decref(merged);
  merged = pcp_services_replication_result_merge(local, global, 2);
  assert_int_equal(json_array_size(json_object_get(merged, "entities")), 2);
  json_decref(merged);
  // With a policy that allows replication but not raw payloads, the
  // observation goes.
  pcp_store_graph_policy_t n = {.namespace_id = "n",
                                .allow_global_replication = true};
  pcp_store_graph_policy_list_t policies = {.items = &n, .count = 1};
  pcp_services_replication_result_filter(global, &policies);
  assert_int_equal(json_array_size(json_object_get(global, "observations")), 0);
  assert_int_equal(json_array_size(json_object_get(global, "entities")), 2);
  json_decref(local);
  json_decref(global);
}

static void event_mutations(void** state) {
  (void)state;
  json_t* event =
      json_pack("{s:s, s:s, s:s, s:s, s:{s:i}, s:{s:s}}", "event_id", "ev1",
                "service_id", "svc", "event_type", "training.step", "job_id",
                "j7", "payload", "loss", 3, "provenance", "source", "unit");
  pcp_store_mutation_t m[2];
  EXPECT_OK(pcp_services_replication_event_mutations(event, "gw", "lab", m));
  assert_string_equal(m[0].mutation_id, "ev1:subject");
  assert_string_equal(m[0].target_id, "job:j7");
  assert_string_equal(m[0].namespace_id, "lab/shared");
  assert_string_equal(
      json_string_value(json_object_get(m[0].payload, "entity_type")),
      "training_job");
  assert_string_equal(m[1].mutation_id, "ev1:observation");
  assert_int_equal(m[1].mutation_type, PCP_STORE_MUTATION_APPEND_OBSERVATION);
  assert_string_equal(
      json_string_value(json_object_get(m[1].provenance, "source")), "unit");
  assert_string_equal(
      json_string_value(json_object_get(m[1].provenance, "gateway_id")), "gw");
  for (int i = 0; i < 2; ++i) {
    pcp_services_replication_item_deinitialize(&m[i]);
  }
  json_object_del(event, "service_id");
  pcp_status_t status =
      pcp_services_replication_event_mutations(event, "gw", "lab", m);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  pcp_status_ignore(status);
  for (int i = 0; i < 2; ++i) {
    pcp_services_replication_item_deinitialize(&m[i]);
  }
  json_decref(event);
}

//===----------------------------------------------------------------------===//
// Store: exactly-once batch apply and policies (real SQLite)
//===----------------------------------------------------------------------===//

typedef struct fixture_t {
  char dir[256];
  pcp_store_t* store;
} fixture_t;

static pcp_store_t* open_store(const char* dir) {
  pcp_store_options_t options;
  pcp_store_options_initialize(&options);
  options.state_dir = dir;
  options.sync_mode = PCP_STORE_SYNC_NORMAL;
  pcp_store_t* store = NULL;
  EXPECT_OK(pcp_store_create(&options, pcp_allocator_system(), &store));
  return store;
}

static int setup(void** state) {
  fixture_t* f = calloc(1, sizeof(*f));
  const char* tmp = getenv("TMPDIR");
  snprintf(f->dir, sizeof(f->dir), "%s/pcp-repl-XXXXXX",
           tmp && tmp[0] ? tmp : "/tmp");
  if (!mkdtemp(f->dir)) {
    free(f);
    return -1;
  }
  f->store = open_store(f->dir);
  *state = f;
  return 0;
}

static int teardown(void** state) {
  fixture_t* f = *state;
  pcp_store_release(f->store);
  char command[512];
  snprintf(command, sizeof(command), "rm -rf '%s'", f->dir);
  int rc = system(command);
  free(f);
  return rc == 0 ? 0 : -1;
}

static void batch_apply_exactly_once(void** state) {
  fixture_t* f = *state;
  pcp_store_mutation_t items[3] = {
      entity("a", "n", PCP_STORE_VISIBILITY_GLOBAL),
      entity("b", "n", PCP_STORE_VISIBILITY_GLOBAL),
      entity("c", "n", PCP_STORE_VISIBILITY_SHARED),
  };
  for (int i = 0; i < 3; ++i) {
    items[i].payload = json_pack("{s:s}", "entity_type", "thing");
  }
  size_t applied = 0, duplicates = 0;
  EXPECT_OK(pcp_store_graph_mutation_batch_apply(f->store, "gw-a", items, 2, 7,
                                                 9, &applied, &duplicates));
  assert_int_equal(applied, 2);
  assert_int_equal(duplicates, 0);
  // The ack is durable: it survives closing the store.
  pcp_store_release(f->store);
  f->store = open_store(f->dir);
  pcp_store_replication_peer_t peer;
  EXPECT_OK(pcp_store_replication_peer_get(f->store, "gw-a", &peer));
  assert_int_equal(peer.acked_sequence_no, 7);
  assert_int_equal(peer.last_sequence_no, 9);
  // A re-sent batch (the ack was lost) applies only what is new.
  EXPECT_OK(pcp_store_graph_mutation_batch_apply(f->store, "gw-a", items, 3, 8,
                                                 9, &applied, &duplicates));
  assert_int_equal(applied, 1);
  assert_int_equal(duplicates, 2);
  pcp_store_graph_log_counts_t counts;
  EXPECT_OK(pcp_store_graph_log_counts_query(f->store, &counts));
  assert_int_equal(counts.entity_count, 3);
  assert_int_equal(counts.mutation_count, 3);
  // A bad item rolls the whole batch back, ack included.
  pcp_store_mutation_t bad[2] = {entity("d", "n", PCP_STORE_VISIBILITY_GLOBAL),
                                 entity("e", "n", PCP_STORE_VISIBILITY_GLOBAL)};
  bad[0].payload = json_pack("{s:s}", "entity_type", "thing");
  bad[1].payload = json_object();  // no entity_type
  pcp_status_t status = pcp_store_graph_mutation_batch_apply(
      f->store, "gw-a", bad, 2, 20, 20, &applied, &duplicates);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_INVALID_ARGUMENT);
  assert_non_null(strstr(pcp_status_message(status), "mutations[1]"));
  pcp_status_ignore(status);
  EXPECT_OK(pcp_store_graph_log_counts_query(f->store, &counts));
  assert_int_equal(counts.entity_count, 3);
  EXPECT_OK(pcp_store_replication_peer_get(f->store, "gw-a", &peer));
  assert_int_equal(peer.acked_sequence_no, 8);
  // A replicated delete of an unknown entity is a logged no-op, not an
  // error that would stop the sender's replication.
  pcp_store_mutation_t gone =
      entity("never-held", "n", PCP_STORE_VISIBILITY_GLOBAL);
  gone.mutation_type = PCP_STORE_MUTATION_DELETE_ENTITY;
  EXPECT_OK(pcp_store_graph_mutation_batch_apply(f->store, "gw-a", &gone, 1, 8,
                                                 9, &applied, &duplicates));
  assert_int_equal(applied, 1);
  // Acks never go down; peers are listed.
  EXPECT_OK(pcp_store_graph_mutation_batch_apply(f->store, "gw-b", NULL, 0, 4,
                                                 5, &applied, &duplicates));
  EXPECT_OK(pcp_store_graph_mutation_batch_apply(f->store, "gw-a", NULL, 0, 1,
                                                 1, &applied, &duplicates));
  pcp_store_replication_peer_list_t peers;
  EXPECT_OK(pcp_store_replication_peer_list(f->store, &peers));
  assert_int_equal(peers.count, 2);
  assert_string_equal(peers.items[0].peer_id, "gw-a");
  assert_int_equal(peers.items[0].acked_sequence_no, 8);
  assert_string_equal(peers.items[1].peer_id, "gw-b");
  assert_int_equal(peers.items[1].last_sequence_no, 5);
  pcp_store_replication_peer_list_deinitialize(&peers);
  for (int i = 0; i < 3; ++i) {
    json_decref(items[i].payload);
  }
  json_decref(bad[0].payload);
  json_decref(bad[1].payload);
}

static void policies_from_the_log(void** state) {
  fixture_t* f = *state;
  pcp_store_graph_policy_t policy;
  pcp_services_replication_policy_default("ns-b", PCP_STORE_VISIBILITY_LOCAL,
                                          &policy);
  policy.allow_global_replication = true;
  const char* namespaces[] = {"ns-b", "ns-a", "ns-b"};
  for (int i = 0; i < 3; ++i) {
    pcp_store_mutation_t m = {.mutation_type = PCP_STORE_MUTATION_POLICY_UPDATE,
                              .timestamp_ns = 1000 + i};
    snprintf(m.namespace_id, sizeof(m.namespace_id), "%s", namespaces[i]);
    snprintf(m.target_id, sizeof(m.target_id), "%s", namespaces[i]);
    policy.default_visibility = (pcp_store_visibility_t)i;
    m.payload = pcp_services_replication_policy_payload(&policy);
    int64_t sequence = 0;
    bool duplicate = false;
    EXPECT_OK(
        pcp_store_graph_mutation_apply(f->store, &m, &sequence, &duplicate));
    json_decref(m.payload);
  }
  pcp_store_graph_policy_list_t list;
  EXPECT_OK(pcp_store_graph_policy_list(f->store, &list));
  assert_int_equal(list.count, 2);
  assert_string_equal(list.items[0].namespace_id, "ns-a");
  assert_int_equal(list.items[0].default_visibility,
                   PCP_STORE_VISIBILITY_SHARED);
  assert_string_equal(list.items[1].namespace_id, "ns-b");
  // The newest record of ns-b wins.
  assert_int_equal(list.items[1].default_visibility,
                   PCP_STORE_VISIBILITY_GLOBAL);
  assert_int_equal(list.items[1].updated_at_ns, 1002);
  pcp_store_graph_policy_t found;
  pcp_services_replication_policy_lookup(&list, "ns-b",
                                         PCP_STORE_VISIBILITY_LOCAL, &found);
  assert_true(found.allow_global_replication);
  pcp_services_replication_policy_lookup(&list, "ns-c",
                                         PCP_STORE_VISIBILITY_SHARED, &found);
  assert_false(found.allow_global_replication);
  assert_int_equal(found.default_visibility, PCP_STORE_VISIBILITY_SHARED);
  pcp_store_graph_policy_list_deinitialize(&list);

  pcp_store_namespace_stats_list_t stats;
  EXPECT_OK(pcp_store_namespace_stats_list(f->store, &stats));
  assert_int_equal(stats.count, 2);
  assert_int_equal(stats.items[1].policy_count, 2);
  assert_int_equal(stats.items[1].pending_count, 2);
  pcp_store_namespace_stats_list_deinitialize(&stats);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(eligibility),
      cmocka_unit_test(policy_update_validates),
      cmocka_unit_test(batching),
      cmocka_unit_test(filter_and_merge),
      cmocka_unit_test(event_mutations),
      cmocka_unit_test_setup_teardown(batch_apply_exactly_once, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(policies_from_the_log, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
