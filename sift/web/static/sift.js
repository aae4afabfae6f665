// Live pages: every second, fetch this page's live fragment (the same URL with _live=1) and put it in place
// when it changed. No full reload: the filters, the scroll position and focus outside the fragment stay.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live || !live.dataset.live) { return; }
  var base = live.dataset.live;
  var url = base + (base.indexOf("?") < 0 ? "?" : "&") + "_live=1";
  var shown = live.innerHTML;
  var busy = false;
  function refresh() {
    if (busy || document.hidden) { return; }
    busy = true;
    fetch(url, { credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (!response.ok || response.headers.get("X-Sift-Live") !== "1") { return null; }
        return response.text();
      })
      .then(function (text) {
        var typing = document.activeElement;
        // Never replace a field while the operator types into it (a back-off's seconds, say).
        if (typing && typing.tagName === "INPUT" && live.contains(typing)) { return; }
        if (text !== null && text !== shown) {
          shown = text;
          live.innerHTML = text;  // the server's escaped HTML, as the page itself shows it
        }
      })
      .catch(function () { /* the server is away: try again on the next tick */ })
      .then(function () { busy = false; });
  }
  window.setInterval(refresh, 1000);

  // An action's form is posted in the background and the live fragment shows its effect; without this
  // script the same form posts and redirects back.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!(form instanceof HTMLFormElement) || !form.classList.contains("action")) { return; }
    event.preventDefault();
    var notice = document.getElementById("notice");
    var body = new URLSearchParams(new FormData(form));
    if (document.activeElement && live.contains(document.activeElement)) { document.activeElement.blur(); }
    fetch(form.action, {
      method: "POST", body: body, credentials: "same-origin",
      headers: { "X-Sift-Fetch": "1" }
    }).then(function (response) {
      if (notice) { notice.textContent = response.ok ? "" : "Refused (" + response.status + ")."; }
      refresh();
    }).catch(function () {
      if (notice) { notice.textContent = "The server did not answer."; }
    });
  });
}());
