// pg-claim web: the page updates itself without a full reload. Every few
// seconds (data-refresh on <main>) it fetches its own URL with part=main, the
// page's main part as HTML the server escaped, and puts it in place. Without
// JavaScript the page refreshes itself (a <noscript> refresh).
(function () {
  "use strict";
  var main = document.getElementById("main");
  if (!main) {
    return;
  }
  var every = Math.max(1, Number(main.getAttribute("data-refresh")) || 3) * 1000;
  var updates = 0;
  function tick() {
    var url = new URL(window.location.href);
    url.searchParams.set("part", "main");
    fetch(url.toString(), { credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (!r.ok) {
          throw new Error("HTTP " + r.status);
        }
        return r.text();
      })
      .then(function (text) {
        // a form being used is not replaced under the pointer
        if (document.activeElement && main.contains(document.activeElement) &&
            document.activeElement.tagName === "BUTTON") {
          return;
        }
        main.innerHTML = text;
        updates += 1;
        document.documentElement.setAttribute("data-updates", String(updates));
        document.documentElement.removeAttribute("data-stale");
      })
      .catch(function (e) {
        document.documentElement.setAttribute("data-stale", String(e));
      })
      .then(function () {
        window.setTimeout(tick, every);
      });
  }
  window.setTimeout(tick, every);
})();
