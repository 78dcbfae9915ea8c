// celeriac dashboard: makes pages live. Every page works without this
// script; with it, a server-sent "change" event makes the page fetch its
// own live part again (rendered and escaped by the server) and swap it in.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var state = document.getElementById("live-state");
  if (!live || !window.EventSource || !window.fetch) return;
  var busy = false, again = false;
  // A person who is choosing dead letters or typing keeps the page as it
  // is until done.
  function editing() {
    return live.querySelector("input[type=checkbox]:checked") !== null ||
      (document.activeElement && live.contains(document.activeElement) &&
        document.activeElement.tagName === "INPUT");
  }
  function refresh() {
    if (busy) { again = true; return; }
    if (editing()) return;
    busy = true;
    fetch(location.href, { headers: { "X-Fragment": "1" }, credentials: "same-origin" })
      .then(function (r) {
        // The session ended: a reload goes to the login form.
        if (r.status === 401) location.reload();
        return r.ok ? r.text() : Promise.reject(r.status);
      })
      .then(function (html) { if (!editing()) live.innerHTML = html; })
      .catch(function () {})
      .then(function () {
        busy = false;
        if (again) { again = false; refresh(); }
      });
  }
  // Behind a reverse proxy the dashboard lives under a prefix (--url-prefix).
  var es = new EventSource((document.documentElement.dataset.prefix || "") + "/events");
  var bannerEl = document.getElementById("broker-down");
  var brokerOK = !bannerEl || bannerEl.hidden;
  function counts(ev) {
    try {
      var c = JSON.parse(ev.data);
      var w = document.getElementById("count-workers"), t = document.getElementById("count-tasks");
      if (w) w.textContent = String(c.workers);
      if (t) t.textContent = String(c.tasks);
      // The stream is live, the broker may not be: say which.
      var banner = document.getElementById("broker-down");
      brokerOK = !c.broker_down;
      if (banner) {
        banner.hidden = brokerOK;
        banner.textContent = brokerOK ? "" : "The broker does not answer since " + c.broker_down_since + ": " +
          c.broker_down + ". Workers, tasks and queues below are as last seen; queue depths are unknown.";
      }
      if (state) state.textContent = brokerOK ? "live" : "broker down";
    } catch (e) {}
  }
  es.addEventListener("change", function (ev) { counts(ev); refresh(); });
  es.onopen = function () { if (state) state.textContent = brokerOK ? "live" : "broker down"; };
  es.onerror = function () {
    if (state) state.textContent = "reconnecting";
    // A refused stream (401: the session ended) is not retried by the
    // browser; the page's own fetch then finds out and reloads.
    if (es.readyState === EventSource.CLOSED) refresh();
  };
})();
