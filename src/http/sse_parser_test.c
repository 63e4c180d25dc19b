// SPDX-License-Identifier: Apache-2.0
//
// The client-side SSE parser, sans I/O: the WHATWG interpretation rules,
// every split of a stream giving the same events, and the caps.

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "http/http.h"

#define MAX_EVENTS 16

typedef struct collector_t {
  char events[MAX_EVENTS][256];  // "type|data|id"
  size_t count;
  size_t fail_at;  // 1-based event index whose callback fails; 0: never
} collector_t;

static pcp_status_t collect(void* user_data,
                            const pcp_http_sse_event_t* event) {
  collector_t* c = user_data;
  assert_true(c->count < MAX_EVENTS);
  assert_int_equal(strlen(event->data), event->data_length);
  snprintf(c->events[c->count], sizeof(c->events[0]), "%s|%s|%s", event->type,
           event->data, event->last_event_id);
  ++c->count;
  if (c->fail_at && c->count == c->fail_at) {
    return pcp_make_status(PCP_STATUS_ABORTED, "stop here");
  }
  return pcp_ok_status();
}

// Feeds |text| in pieces of |piece| bytes (0: all at once).
static pcp_status_t parse(const char* text, size_t length, size_t piece,
                          size_t max_line, size_t max_event, collector_t* c,
                          bool* out_partial) {
  pcp_http_sse_parser_t parser;
  pcp_http_sse_parser_initialize(max_line, max_event, collect, c, &parser);
  pcp_status_t status = pcp_ok_status();
  for (size_t at = 0; at < length && !status;) {
    size_t n = piece && piece < length - at ? piece : length - at;
    status = pcp_http_sse_parser_feed(&parser, text + at, n);
    at += n;
  }
  if (out_partial) {
    *out_partial = pcp_http_sse_parser_has_partial(&parser);
  }
  pcp_http_sse_parser_deinitialize(&parser);
  return status;
}

// Mixed line ends, a BOM, comments, multi-line data, fields without a
// space or a colon, an event type, ids, an event without data, unknown
// fields and retry.
static const char kStream[] =
    "\xEF\xBB\xBF"
    ": a comment\r\n"
    "data: one\r\n"
    "data: uno\r\n"
    "\r\n"
    "event: delta\n"
    "id: 7\n"
    "data:two\n"
    "data:  three\r"
    "\r"
    "event: ignored-no-data\n"
    "retry: 100\n"
    "\n"
    "data\n"
    "unknown: x\n"
    "data: {\"a\":1}\r\n"
    "\r\n"
    "id\n"
    "data: [DONE]\n"
    "\n"
    "data: unfinished";

static void events_match_the_spec(void** state) {
  (void)state;
  collector_t c = {0};
  bool partial = false;
  assert_null(parse(kStream, sizeof(kStream) - 1, 0, 0, 0, &c, &partial));
  assert_int_equal(c.count, 4);
  assert_string_equal(c.events[0], "|one\nuno|");
  assert_string_equal(c.events[1], "delta|two\n three|7");
  // A bare "data" is an empty data line; the type of the dropped event does
  // not leak into the next one.
  assert_string_equal(c.events[2], "|\n{\"a\":1}|7");
  // A bare "id" resets the last event id.
  assert_string_equal(c.events[3], "|[DONE]|");
  assert_true(partial);  // "data: unfinished" never ended
}

static void every_split_gives_the_same_events(void** state) {
  (void)state;
  collector_t whole = {0};
  assert_null(parse(kStream, sizeof(kStream) - 1, 0, 0, 0, &whole, NULL));
  // Piece sizes that split the BOM, every CRLF pair and every field name.
  for (size_t piece = 1; piece <= 9; ++piece) {
    collector_t c = {0};
    assert_null(parse(kStream, sizeof(kStream) - 1, piece, 0, 0, &c, NULL));
    assert_int_equal(c.count, whole.count);
    for (size_t i = 0; i < c.count; ++i) {
      assert_string_equal(c.events[i], whole.events[i]);
    }
  }
}

static void a_false_bom_start_is_content(void** state) {
  (void)state;
  // 0xEF alone, then other bytes: the byte belongs to the first line (a
  // field named "\xEF" + "data", unknown, so nothing is dispatched).
  const char text[] =
      "\xEF"
      "data: x\n\ndata: y\n\n";
  collector_t c = {0};
  assert_null(parse(text, sizeof(text) - 1, 1, 0, 0, &c, NULL));
  assert_int_equal(c.count, 1);
  assert_string_equal(c.events[0], "|y|");
}

static void a_line_over_the_cap_fails(void** state) {
  (void)state;
  // Exactly the cap is fine: "data: " + 10 bytes = 16.
  const char fits[] = "data: 0123456789\n\n";
  collector_t c = {0};
  assert_null(parse(fits, sizeof(fits) - 1, 3, 16, 0, &c, NULL));
  assert_int_equal(c.count, 1);
  const char over[] = "data: 0123456789A\n\n";
  memset(&c, 0, sizeof(c));
  pcp_status_t status = parse(over, sizeof(over) - 1, 3, 16, 0, &c, NULL);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(pcp_status_message(status), "line over 16 bytes"));
  pcp_status_ignore(status);
  assert_int_equal(c.count, 0);
  // The cap holds without any line end in sight (a server that never sends
  // one cannot make the client buffer it all).
  char* endless = malloc(1 << 20);
  assert_non_null(endless);
  memset(endless, 'x', 1 << 20);
  status = parse(endless, 1 << 20, 4096, 0, 0, &c, NULL);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_RESOURCE_EXHAUSTED);
  pcp_status_ignore(status);
  free(endless);
}

static void event_data_over_the_cap_fails(void** state) {
  (void)state;
  // Two lines of 4 bytes join to "abcd\nefgh" = 9 bytes.
  const char text[] = "data: abcd\ndata: efgh\n\n";
  collector_t c = {0};
  assert_null(parse(text, sizeof(text) - 1, 0, 0, 9, &c, NULL));
  assert_string_equal(c.events[0], "|abcd\nefgh|");
  memset(&c, 0, sizeof(c));
  pcp_status_t status = parse(text, sizeof(text) - 1, 0, 0, 8, &c, NULL);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_RESOURCE_EXHAUSTED);
  assert_non_null(strstr(pcp_status_message(status), "over 8 bytes"));
  pcp_status_ignore(status);
}

static void a_callback_failure_stops_the_feed(void** state) {
  (void)state;
  const char text[] = "data: 1\n\ndata: 2\n\ndata: 3\n\n";
  collector_t c = {.fail_at = 2};
  pcp_status_t status = parse(text, sizeof(text) - 1, 0, 0, 0, &c, NULL);
  assert_int_equal(pcp_status_code(status), PCP_STATUS_ABORTED);
  pcp_status_ignore(status);
  assert_int_equal(c.count, 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(events_match_the_spec),
      cmocka_unit_test(every_split_gives_the_same_events),
      cmocka_unit_test(a_false_bom_start_is_content),
      cmocka_unit_test(a_line_over_the_cap_fails),
      cmocka_unit_test(event_data_over_the_cap_fails),
      cmocka_unit_test(a_callback_failure_stops_the_feed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
