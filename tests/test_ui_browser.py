"""The page at `/` (issue 14) in a real browser: Debian's chromium and chromedriver, driven by Selenium,
against a real `python -m app` serving the shipped models/.

Every expectation is relative to the API's own answer for the same text (the shipped models will be
replaced), never a fixed probability. Skipped, saying why, only when chromium or chromedriver is missing
(`.ci/machine-deps` installs them). UI_SCREENSHOTS=DIR also writes the README's screenshots there."""

from __future__ import annotations

import json
import os
import re
import signal
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select, WebDriverWait

from app.http.server import create_app
from app.http.ui import _FILES
from app.settings import Settings

try:
    from app_fixtures import REPO, Server, free_port, run_server, wait_for
except ImportError:  # tests/ made a package
    from tests.app_fixtures import REPO, Server, free_port, run_server, wait_for

# The slow tier (docs/ci.md): each test drives a real Chromium against a real server, 5 to 25 s apiece.
pytestmark = pytest.mark.slow
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
MODELS = REPO / "models"
SENTENCE = "The chef cooked the airport in the kitchen before the guests arrived."
KEY = "s3cret-key-for-the-page"
WAIT_S = 30


# ------------------------------------------------------------------------------ no browser needed
def test_page_is_served_and_no_ui_turns_it_off():
    assert Settings.from_sources(["--no-ui"], env={})[0].ui is False
    assert Settings.from_sources([], env={"ELECTRA_UI": "false"})[0].ui is False
    with_ui = {r.path for r in create_app(Settings(models_dir=MODELS)).routes}
    without = {r.path for r in create_app(Settings(models_dir=MODELS, ui=False)).routes}
    assert "/" in with_ui and any(p.startswith("/ui") for p in with_ui)
    assert "/" not in without and not any(p.startswith("/ui") for p in without)
    static = REPO / "app" / "static"
    html = (static / "index.html").read_text()
    # Offline: nothing the page loads comes from another host.
    for name in ("index.html", *_FILES):
        assert not re.search(r"(src|href|from)[= ][\"']?(https?:)?//", (static / name).read_text()), name
    # Every file the page loads (index.html's links, then the modules' imports) is on the allow-list, and
    # the allow-list is exactly those files: app/static holds nothing else.
    loaded, todo = set(), re.findall(r'(?:src|href)="ui/([^"]+)"', html)
    while todo:
        ref = todo.pop()
        assert (static / ref).is_file() and ref in _FILES, ref
        if ref.endswith(".js") and ref not in loaded:
            todo += re.findall(r'^import .* from "\./([^"/]+)";$', (static / ref).read_text(), re.M)
        loaded.add(ref)
    assert loaded == set(_FILES)
    # main.js's imports are preloaded beside it, all of them: one forgotten costs a round trip after
    # main.js is parsed (two, for an import of an import) before the page can run.
    preloaded = set(re.findall(r'<link rel="modulepreload" href="ui/([^"]+)">', html))
    assert preloaded == {f for f in loaded if f.endswith(".js")} - {"main.js"}
    assert {p.name for p in static.iterdir()} == {"index.html", *_FILES}


def test_the_pages_files_are_served_and_nothing_else_under_ui(server):
    """A general static router answered a NUL, an over-long name or a path through a file with a 500 and
    a traceback in the log (public even with --api-key), and served index.html again without the page's
    security headers; each file is revalidated by its ETag."""
    static = REPO / "app" / "static"
    with server.client() as c:
        etags = set()
        for name in _FILES:
            r = c.get(f"/ui/{name}")
            # A browser runs a module script only when it is served as JavaScript.
            kind = "text/javascript" if name.endswith(".js") else "text/css"
            assert r.status_code == 200 and r.headers["content-type"].startswith(kind), name
            assert r.content == (static / name).read_bytes(), name
            assert r.headers["x-content-type-options"] == "nosniff"
            assert c.get(f"/ui/{name}", headers={"if-none-match": r.headers["etag"]}).status_code == 304
            etags.add(r.headers["etag"])
        assert len(etags) == len(_FILES)
        for path in (
            "/ui/main.js%00.css",
            "/ui/" + "a" * 300,
            "/ui/main.js/x",
            "/ui/index.html",
            "/ui/../app/errors.py",
        ):
            r = c.get(path)
            assert r.status_code == 404 and r.json()["error"]["type"] == "not_found", (path, r.text[:200])
        # Every answer, JSON included, is read as the type it says; the page sends no referrer.
        assert c.post("/detect", json={"text": "a b"}).headers["x-content-type-options"] == "nosniff"
        page = c.get("/")
        assert page.headers["referrer-policy"] == "no-referrer"
        assert page.content == (static / "index.html").read_bytes()
        again = c.get("/", headers={"if-none-match": page.headers["etag"]})
        assert again.status_code == 304 and "content-security-policy" in again.headers
    assert "Traceback" not in server.log()


# ------------------------------------------------------------------------------ browser fixtures
@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Server:
    with run_server(MODELS, log_dir=tmp_path_factory.mktemp("ui-server")) as s:
        yield s


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory) -> Server:
    with run_server(
        MODELS, "--api-key", KEY, log_dir=tmp_path_factory.mktemp("ui-keyed"), headers={"x-api-key": KEY}
    ) as s:
        yield s


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        pytest.skip(f"browser test needs Debian's chromium and chromium-driver: {', '.join(missing)} missing "
                    "(run .ci/machine-deps)")  # fmt: skip
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # console_errors() reads the console
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", "--window-size=1280,900",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):  # fmt: skip
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=opts)
    driver.set_script_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


def open_page(driver, server: Server):
    driver.set_window_size(1280, 900)
    driver.get(server.url + "/")
    WebDriverWait(driver, WAIT_S).until(
        lambda d: (
            d.find_element("id", "model").is_enabled() or d.find_element("id", "key-form").is_displayed()
        )
    )


def wait_visible(driver, element_id: str):
    return WebDriverWait(driver, WAIT_S).until(lambda d: d.find_element("id", element_id).is_displayed())


def submit(driver, text: str, model: str | None = None, *, keyboard: bool = False) -> None:
    if model:
        Select(driver.find_element("id", "model")).select_by_value(model)
    # A marker that the answer to *this* submission is on screen: the status line changes.
    driver.execute_script("document.getElementById('status').textContent = 'waiting';")
    box = driver.find_element("id", "text")
    box.clear()
    box.send_keys(text)
    if keyboard:
        box.send_keys(Keys.CONTROL, Keys.ENTER)
    else:
        driver.find_element("id", "run").click()
    WebDriverWait(driver, WAIT_S).until(
        lambda d: (
            d.find_element("id", "status").text not in ("waiting", "Scoring…", "Loading the models…")
            and "busy" not in d.find_element("id", "run").get_attribute("class")
        )
    )


def hold_requests(driver) -> None:
    """The page's requests wait in the page until release_requests(): a slow server, answering when the
    test says, with no clock to race."""
    driver.execute_script(
        "window.__held = []; const f = window.__unheld = window.fetch;"
        "window.fetch = (...a) => new Promise((go) => window.__held.push(go)).then(() => f(...a));"
    )


def release_requests(driver, n: int) -> None:
    """Once the page has made `n` requests since hold_requests() (not fewer, not more), sends them all, in
    the order they were made; later requests are sent at once."""
    WebDriverWait(driver, 5).until(lambda d: d.execute_script("return window.__held.length") >= n)
    held = driver.execute_script(
        "window.fetch = window.__unheld; const n = window.__held.length;"
        "window.__held.forEach((go) => go()); return n;"
    )
    assert held == n


def api_detect(server: Server, text: str, threshold: float) -> dict:
    with server.client() as c:
        r = c.post("/detect", json={"text": text, "threshold": threshold, "return": "both"})
    assert r.status_code == 200, r.text
    return r.json()["results"][0]


def shading(driver) -> list[tuple[str, float, bool]]:
    """(text, background alpha, marked at threshold) of every shaded span, in text order."""
    return [
        (s, float(a), over)
        for s, a, over in driver.execute_script(
            """return [...document.querySelectorAll('#marked .w')].map(e => {
                 const m = getComputedStyle(e).backgroundColor.match(/rgba?\\(([^)]*)\\)/)[1].split(',');
                 return [e.textContent, m.length > 3 ? m[3] : '1', e.classList.contains('over')]; });"""
        )
    ]


def text_contrast(driver, element) -> float:
    """WCAG contrast ratio of `element` as drawn on screen: its most common colour (the background) against
    its darkest (the core of its letters). Read from a screenshot, so filters and opacity count."""
    rgba = driver.execute_async_script(
        """const [b64, done] = arguments, img = new Image();
           img.onload = () => {
             const c = document.createElement('canvas');
             [c.width, c.height] = [img.width, img.height];
             const g = c.getContext('2d');
             g.drawImage(img, 0, 0);
             done(Array.from(g.getImageData(0, 0, c.width, c.height).data));
           };
           img.src = 'data:image/png;base64,' + b64;""",
        element.screenshot_as_base64,
    )
    pixels = [tuple(rgba[i : i + 3]) for i in range(0, len(rgba), 4)]

    def luminance(rgb):
        r, g, b = (
            c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in (v / 255 for v in rgb)
        )
        return 0.2126 * r + 0.7152 * g + 0.0722 * b

    background = Counter(pixels).most_common(1)[0][0]
    darkest = min(pixels, key=luminance)
    return (luminance(background) + 0.05) / (luminance(darkest) + 0.05)


def console_errors(driver) -> list[str]:
    """The console's errors since the last call (a refused script, a CSP violation, an uncaught exception).
    A failed request is one too, so only a test whose every request succeeds can expect none."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def pct(p: float) -> str:
    """As the page writes a probability: to 0.1%, and ">99.9%" / "<0.1%" for one that only rounds to 100 / 0."""
    s = f"{100 * p:.1f}"
    return ">99.9%" if s == "100.0" and p < 1 else "<0.1%" if s == "0.0" and p > 0 else s + "%"


# ------------------------------------------------------------------------------ browser tests
def test_top_word_shaded_most_and_first_in_table(browser, server):
    console_errors(browser)  # an earlier test's
    open_page(browser, server)
    submit(browser, SENTENCE, keyboard=True)  # Ctrl+Enter
    wait_visible(browser, "detect")
    answer = api_detect(
        server, SENTENCE, float(browser.find_element("id", "threshold").get_attribute("value"))
    )
    words = answer["words"]
    spans = shading(browser)
    assert [s[0] for s in spans] == [w["text"] for w in words]
    top = max(w["prob"] for w in words)
    # The most strongly shaded span is the API's most probable word, and shades follow probabilities.
    strongest = max(a for _, a, _ in spans)
    assert {i for i, (_, a, _) in enumerate(spans) if a == strongest} == {
        i for i, w in enumerate(words) if w["prob"] == top
    }
    by_prob = sorted(range(len(words)), key=lambda i: words[i]["prob"])
    alphas = [spans[i][1] for i in by_prob]
    assert alphas == sorted(alphas)

    # The table view (switched by keyboard-reachable radio), highest first, probability in text.
    browser.find_element("css selector", "input[name=view][value=table]").click()
    wait_visible(browser, "table-view")
    assert not browser.find_element("id", "text-view").is_displayed()
    rows = browser.find_elements("css selector", "#table tbody tr")
    assert len(rows) == len(words)
    first = rows[0].find_elements("css selector", "th, td")
    assert first[1].text in {w["text"] for w in words if w["prob"] == top}
    assert first[2].text == pct(top)
    shown = [float(r.find_elements("css selector", "td")[1].text.strip("<>%")) for r in rows]
    assert shown == sorted(shown, reverse=True)

    # Keyboard only: Tab to the shaded text, arrows move, the focused word's probability shows as text.
    browser.find_element("css selector", "input[name=view][value=text]").click()
    browser.find_element("id", "text").click()
    for _ in range(12):
        browser.switch_to.active_element.send_keys(Keys.TAB)
        if "w" in (browser.switch_to.active_element.get_attribute("class") or "").split():
            break
    focused = browser.switch_to.active_element
    assert focused.text == words[0]["text"]
    focused.send_keys(Keys.ARROW_RIGHT)
    focused = browser.switch_to.active_element
    assert focused.text == words[1]["text"]
    tip = browser.find_element("id", "tip")
    assert tip.is_displayed() and pct(words[1]["prob"]) in tip.text and words[1]["text"] in tip.text

    # Tokens instead of words: one span per token, the word's pieces.
    pieces = browser.find_element("id", "pieces-h")  # the table's column, hidden here: its textContent
    assert pieces.get_attribute("textContent") == "Pieces"
    browser.find_element("css selector", "input[name=unit][value=tokens]").click()
    assert [s[0] for s in shading(browser)] == [t["text"] for t in answer["tokens"]]
    # A token's row names the word it is in, and the column says so (it said "Pieces").
    assert pieces.get_attribute("textContent") == "In word"
    cell = browser.find_element("css selector", "#table tbody tr td.pieces").get_attribute("textContent")
    assert cell.startswith("in “"), cell
    assert console_errors(browser) == []


def test_slider_starts_at_the_detectors_own_threshold(browser, server):
    """The page starts where /detect does without a threshold: the bundle's default (issue 21)."""
    with server.client() as c:
        detector = next(
            m for m in c.get("/models").json()["models"] if m["kind"] == "detector" and m["default"]
        )
    open_page(browser, server)
    slider = browser.find_element("id", "threshold")
    assert float(slider.get_attribute("value")) == pytest.approx(detector["threshold"])
    # The result card is hidden until a first answer: read the text the page set, shown or not.
    assert (
        browser.find_element("id", "threshold-out").get_attribute("textContent")
        == f"{detector['threshold']:.2f}"
    )
    note = browser.find_element("id", "threshold-note").get_attribute("textContent")
    assert note == ("model default" if detector["calibrated"] else "model default (not calibrated)")


def test_threshold_remarks_spans_without_a_request(browser, server):
    open_page(browser, server)
    submit(browser, SENTENCE)
    wait_visible(browser, "detect")
    words = api_detect(server, SENTENCE, 0.5)["words"]
    browser.execute_script(
        "window.__fetches = 0; const f = window.fetch;"
        "window.fetch = (...a) => { window.__fetches++; return f(...a); };"
    )
    before = server.metric("electra_requests_total", endpoint="/detect")
    slider = browser.find_element("id", "threshold")

    def marked() -> list[bool]:
        return [over for _, _, over in shading(browser)]

    def spannable(w) -> bool:  # as the API's spans: punctuation is never marked
        return any(ch.isalnum() for ch in w["text"])

    slider.send_keys(Keys.HOME)  # threshold 0: every word is at or above it
    assert marked() == [spannable(w) for w in words] and not all(marked())
    slider.send_keys(Keys.END)  # threshold 1
    assert marked() == [w["prob"] >= 1.0 and spannable(w) for w in words]
    # Between two of the API's word probabilities: exactly the words above it are marked.
    probs = sorted({round(w["prob"], 2) for w in words})
    mid = probs[len(probs) // 2]
    browser.execute_script(
        "const s = arguments[0]; s.value = arguments[1]; s.dispatchEvent(new Event('input'));", slider, mid
    )
    expected = [w["prob"] >= mid and spannable(w) for w in words]
    assert marked() == expected and any(expected)
    assert browser.find_element("id", "threshold-out").text == f"{mid:.2f}"
    summary = browser.find_element("id", "summary").text
    # Of the words that can be spans, as the API's replaced_fraction counts them (punctuation in neither).
    assert f"{sum(expected)} of {sum(map(spannable, words))} words" in summary
    # The table marks the same words, in the bold the text view gives them, and the others not.
    weights = browser.execute_script(
        "return [...document.querySelectorAll('#table tbody tr')].map(tr => "
        "[tr.classList.contains('over'), getComputedStyle(tr.cells[1]).fontWeight])"
    )
    assert sorted({(o, int(w) >= 700) for o, w in weights}) == sorted({(o, o) for o, _ in weights}), weights
    # A focused word carries its probability for a screen reader: the tip describes it.
    first = browser.find_element("css selector", "#marked .w")
    first.click()
    assert first.get_attribute("aria-describedby") == "tip"
    assert browser.execute_script("return window.__fetches") == 0
    assert server.metric("electra_requests_total", endpoint="/detect") == before
    # Away from the model's own threshold, the note says which that is (it said "model default" still).
    note = browser.find_element("id", "threshold-note").get_attribute("textContent")
    assert note.startswith("(model default 0.") and note != "model default", note
    # An edited text's result is marked as out of date until the next Check.
    stale = browser.find_element("css selector", "#detect .stale-note")
    assert not stale.is_displayed()
    hottest = browser.execute_script(
        "return [...document.querySelectorAll('#marked .w')].sort((a, b) => b.dataset.prob - a.dataset.prob)[0]"
    )
    browser.execute_script("document.activeElement.blur()")  # no focus ring in the picture
    assert text_contrast(browser, hottest) >= 4.5  # the darkest shade keeps its text readable (WCAG AA)
    browser.find_element("id", "text").send_keys(" more")
    assert stale.is_displayed()
    assert "stale" in browser.find_element("id", "detect").get_attribute("class")
    # Greyed, still readable: faded to opacity .55, its text stood at 3.4:1.
    browser.execute_script("document.activeElement.blur()")
    assert text_contrast(browser, hottest) >= 4.5
    # Another model hides this result; choosing the detector again shows it again, as it still holds.
    model = Select(browser.find_element("id", "model"))
    detector = model.first_selected_option.get_attribute("value")
    other = next(o.get_attribute("value") for o in model.options if o.get_attribute("value") != detector)
    model.select_by_value(other)
    assert not browser.find_element("id", "detect").is_displayed()
    model.select_by_value(detector)
    assert browser.find_element("id", "detect").is_displayed()
    # An edit made while the text is scored leaves its answer stale: the answer is the sent text's (the
    # page recorded the box's text when the answer came, and showed it as current, with no note).
    hold_requests(browser)
    browser.find_element("id", "run").click()
    browser.find_element("id", "text").send_keys(" again")
    release_requests(browser, 1)
    WebDriverWait(browser, WAIT_S).until(lambda d: d.find_element("id", "status").text.startswith("Scored"))
    assert browser.find_element("id", "marked").text == SENTENCE + " more"
    assert stale.is_displayed()
    # Check pressed while another is under way, with another model chosen: the newer Check wins (it was
    # ignored, and the first answer then dropped as another model's: the status went blank, nothing shown).
    hold_requests(browser)
    browser.find_element("id", "run").click()
    model.select_by_value(other)
    browser.find_element("id", "run").click()
    release_requests(browser, 2)  # the first is sent too, after the second Check aborted it
    WebDriverWait(browser, WAIT_S).until(lambda d: d.find_element("id", "status").text.startswith("Scored"))
    assert browser.find_element("id", "classify").is_displayed()
    assert not browser.find_element("id", "detect").is_displayed()
    assert not browser.find_element("id", "error").is_displayed()


def test_long_text_is_one_shaded_text(browser, server):
    text = " ".join([SENTENCE] * 60)  # several model windows; the user sees one text
    open_page(browser, server)
    submit(browser, text)
    wait_visible(browser, "detect")
    answer = api_detect(server, text, 0.5)
    assert answer["summary"]["windows"] > 1
    assert [s[0] for s in shading(browser)] == [w["text"] for w in answer["words"]]
    assert browser.find_element("id", "marked").text == text
    assert f"Windows\n{answer['summary']['windows']}" in browser.find_element("id", "summary").text
    # A word reached with End or Home is scrolled to, and its tip stays beside it (the scroll hid it at once).
    browser.find_element("css selector", "#marked .w").click()
    for key, word in ((Keys.END, answer["words"][-1]), (Keys.HOME, answer["words"][0])):
        browser.switch_to.active_element.send_keys(key)
        gap = browser.execute_async_script(  # once the scroll events have run (the next frames)
            """const done = arguments[0];
               requestAnimationFrame(() => requestAnimationFrame(() => {
                 const tip = document.getElementById('tip'), w = document.activeElement;
                 if (tip.hidden) return done(null);
                 const a = tip.getBoundingClientRect(), b = w.getBoundingClientRect();
                 done(Math.min(Math.abs(a.top - b.bottom), Math.abs(b.top - a.bottom)));
               }));"""
        )
        assert gap is not None and gap < 10, (word["text"], gap)
        assert browser.find_element("id", "tip").text.startswith(f"“{word['text']}”")


def test_a_long_word_wraps_and_one_characters_pieces_show_the_most_probable(browser, server):
    """A Hangul syllable is several tokens with one character's offsets: the token view shades it by its most
    probable piece (it showed the first). A 400-letter word stays inside its tooltip and the phone's table."""
    text = "안녕하세요 the report " + "x" * 400 + " came out"
    open_page(browser, server)
    browser.set_window_size(390, 844)
    submit(browser, text)
    wait_visible(browser, "detect")
    browser.find_element("css selector", "input[name=unit][value=tokens]").click()
    most = {}
    for token in api_detect(server, text, 0.5)["tokens"]:
        key = (token["start"], token["end"])
        most[key] = max(most.get(key, 0.0), token["prob"])
    shown = shading(browser)
    assert [s[0] for s in shown] == [text[a:b] for a, b in most], shown
    for (_, alpha, _), prob in zip(shown, most.values(), strict=True):
        assert alpha == pytest.approx(0.75 * prob**0.5, abs=0.01)
    long_word = next(e for e in browser.find_elements("css selector", "#marked .w") if len(e.text) > 50)
    long_word.click()
    wait_visible(browser, "tip")
    tip = browser.find_element("id", "tip")
    assert browser.execute_script("return arguments[0].scrollWidth <= arguments[0].clientWidth", tip)
    browser.find_element("css selector", "input[name=view][value=table]").click()
    table = browser.find_element("id", "table-view")
    # The phone scrolls the table sideways across its columns, never along one word: no cell is wider than
    # the box that shows it (the 400 letters made one 3,400 px wide).
    widest, box = browser.execute_script(
        "const cells = [...arguments[0].querySelectorAll('tbody th, tbody td')];"
        "return [Math.max(...cells.map(c => c.getBoundingClientRect().width)), arguments[0].clientWidth];",
        table,
    )
    assert widest <= box, (widest, box)
    # Half of a UTF-16 surrogate pair, alone, is sent as U+FFFD: one UTF-16 unit and one code point, as it
    # was, so the words still fall on the text. The server refused the JSON escape of it (400
    # invalid_json, with no advice). The status says what was mended; the result is not marked edited.
    browser.execute_script(
        "document.getElementById('text').value = 'A broken ' + String.fromCharCode(0xd83d) + ' banana pie.';"
    )
    browser.find_element("css selector", "input[name=unit][value=words]").click()
    browser.find_element("id", "run").click()
    WebDriverWait(browser, WAIT_S).until(lambda d: d.find_element("id", "status").text.startswith("Scored"))
    mended = "A broken \ufffd banana pie."
    assert [s[0] for s in shading(browser)] == [w["text"] for w in api_detect(server, mended, 0.5)["words"]]
    assert browser.find_element("id", "marked").get_attribute("textContent") == mended
    assert browser.find_element("id", "status").text.endswith("was scored as \ufffd.")
    assert not browser.find_element("css selector", "#detect .stale-note").is_displayed()
    # A body the server cannot read (here one cut short on its way) is said, with what to do about it.
    browser.execute_script(
        "const f = window.fetch;"
        "window.fetch = (url, o) => f(url, o && o.body ? { ...o, body: o.body.slice(1) } : o);"
    )
    browser.find_element("id", "run").click()
    head, _, todo = error_shown(browser)
    assert "400" in head and "invalid_json" in head and todo.startswith("The server could not read"), head


def test_a_right_to_left_text_reads_right_to_left(browser, server):
    """An Arabic text was laid out left to right: its closing full stop stood at the right, after the first
    word. Its words still line up with the API's offsets, and the left arrow goes to the next word."""
    text = "مرحبا بالعالم، كيف حالك اليوم؟ هذا نص عربي (مع أقواس) وأرقام 123."
    open_page(browser, server)
    submit(browser, text)
    wait_visible(browser, "detect")
    marked = browser.find_element("id", "marked")
    paragraph = "return getComputedStyle(document.querySelector('#marked .para')).direction"
    assert browser.execute_script(paragraph) == "rtl"
    assert (
        browser.execute_script(
            "return getComputedStyle(arguments[0]).direction", browser.find_element("id", "text")
        )
        == "rtl"
    )
    words = api_detect(server, text, 0.5)["words"]
    assert [s[0] for s in shading(browser)] == [w["text"] for w in words] and marked.text == text
    first = browser.find_element("css selector", "#marked .w")
    first.click()
    first.send_keys(Keys.ARROW_LEFT)
    assert browser.switch_to.active_element.text == words[1]["text"]
    # A left-to-right text in the same box is laid out left to right again.
    submit(browser, SENTENCE)
    assert browser.execute_script(paragraph) == "ltr"
    # Each paragraph in its own direction, as in the text box: the box took the first one's for all. The
    # brackets of a left-to-right paragraph after a right-to-left one stay the right way round (not so
    # with `unicode-bidi: plaintext` on the box, in Chromium).
    mixed = "An English line (with brackets).\nمرحبا بالعالم (نص) اليوم.\n\nThe end (really) here."
    submit(browser, mixed)
    directions, bracket_left_of_word, shown = browser.execute_script(
        """const dir = (w) => getComputedStyle(w).direction;
           const spans = [...document.querySelectorAll('#marked .w')];
           const word = spans.find((w) => w.textContent === 'really'), before = word.previousSibling;
           const r = document.createRange();
           r.setStart(before, before.length - 1);
           r.setEnd(before, before.length);
           return [['An', 'مرحبا', 'The'].map((t) => dir(spans.find((w) => w.textContent === t))),
                   r.getBoundingClientRect().right <= word.getBoundingClientRect().left + 1,
                   [...document.querySelectorAll('#marked .para')].map((p) => [p.textContent, p.offsetHeight])];"""
    )
    assert directions == ["ltr", "rtl", "ltr"] and bracket_left_of_word
    # A paragraph a block, and an empty line one line high, as in the text.
    assert [t for t, _ in shown] == mixed.split("\n") and len({h for _, h in shown}) == 1, shown
    arabic = next(e for e in browser.find_elements("css selector", "#marked .w") if e.text == "مرحبا")
    arabic.click()
    arabic.send_keys(Keys.ARROW_LEFT)
    assert browser.switch_to.active_element.text == "بالعالم"
    # An Arabic phrase in an English line reads leftwards too (the paragraph's direction sent the left
    # arrow back to the English word), and the tip keeps each piece of text apart from the numbers beside
    # it (<bdi>): run together, they read in another order, "<0.1%" drawn as ">0.1%".
    submit(browser, "Hello there مرحبا بالعالم")
    arabic = next(e for e in browser.find_elements("css selector", "#marked .w") if e.text == "مرحبا")
    arabic.click()
    arabic.send_keys(Keys.ARROW_LEFT)
    assert browser.switch_to.active_element.text == "بالعالم"
    isolated = browser.execute_script(
        "return [...document.querySelectorAll('#tip bdi')].map((b) => b.textContent)"
    )
    assert isolated and isolated[0] == "بالعالم", isolated
    # A lone word of the other script reads as its line does: by its own script, the arrows on "مرحبا" in
    # an English line, and on "iPhone" in an Arabic one, went the wrong way.
    for line, word, right, left in (("Hello مرحبا world", "مرحبا", "world", "Hello"),
                                    ("مرحبا iPhone بالعالم", "iPhone", "مرحبا", "بالعالم")):  # fmt: skip
        submit(browser, line)
        for key, lands in ((Keys.ARROW_RIGHT, right), (Keys.ARROW_LEFT, left)):
            start = next(e for e in browser.find_elements("css selector", "#marked .w") if e.text == word)
            start.click()
            start.send_keys(key)
            assert browser.switch_to.active_element.text == lands, (line, key)
    # Two Arabic words in an English line: by their neighbours in the text alone, the left arrow bounced
    # between them and never reached "Hello".
    submit(browser, "Hello مرحبا بالعالم world")
    for key, start, path in ((Keys.ARROW_LEFT, "world", ["مرحبا", "بالعالم", "Hello"]),
                             (Keys.ARROW_RIGHT, "Hello", ["بالعالم", "مرحبا", "world"])):  # fmt: skip
        next(e for e in browser.find_elements("css selector", "#marked .w") if e.text == start).click()
        went = []
        for _ in path:
            browser.switch_to.active_element.send_keys(key)
            went.append(browser.switch_to.active_element.text)
        assert went == path, (key, went)


def test_empty_text_shows_the_apis_error(browser, server):
    open_page(browser, server)
    submit(browser, SENTENCE)
    wait_visible(browser, "detect")
    submit(browser, "   ")
    wait_visible(browser, "error")
    with server.client() as c:
        err = c.post("/detect", json={"text": "   "}).json()["error"]
    shown = browser.find_element("id", "error").text
    assert err["message"] in shown and err["type"] in shown
    assert not browser.find_element("id", "detect").is_displayed()  # no stale result beside the error
    # A 200 that is not the server's JSON (a captive portal's login page): said, with what to do about it.
    answer_next_request(browser, 200, "<html>Sign in to the Wi-Fi</html>", "text/html")
    submit(browser, SENTENCE)
    head, _, todo = error_shown(browser)
    assert "200 (bad_response)" in head and "proxy or a login page" in todo


def test_an_off_grid_threshold_another_models_error_and_extreme_numbers(browser, tmp_path):
    """A bundle's threshold between the slider's 0.01 steps (0.575) was snapped to 0.58, shown as 0.58
    ("model default 0.57") and sent so; a classifier's error stayed on screen once the detector was chosen
    again, hiding its last result; 0.9996 read "100.0%", and a fast answer "Scored in 0 ms"."""
    import shutil

    models = tmp_path / "models"
    shutil.copytree(MODELS / "detector", models / "detector")
    manifest = json.loads((models / "detector" / "manifest.json").read_text())
    manifest["threshold"] = 0.575
    (models / "detector" / "manifest.json").write_text(json.dumps(manifest))
    (models / "sentiment").symlink_to(MODELS / "sentiment")
    with run_server(models, log_dir=tmp_path) as s:
        open_page(browser, s)
        slider = browser.find_element("id", "threshold")
        out, note = (browser.find_element("id", i) for i in ("threshold-out", "threshold-note"))
        assert slider.get_attribute("value") == "0.575"
        assert out.get_attribute("textContent") == "0.575"
        assert note.get_attribute("textContent").startswith("model default")
        browser.execute_script(
            "window.__sent = []; const f = window.fetch;"
            "window.fetch = (u, o) => { if (o && o.body) window.__sent.push(JSON.parse(o.body)); return f(u, o); };"
        )
        submit(browser, SENTENCE)
        wait_visible(browser, "detect")
        # Untouched, the slider names no threshold: the server uses the bundle's own, and the page marks
        # what the API's default answer does.
        assert "threshold" not in browser.execute_script("return window.__sent.pop()")
        with s.client() as c:
            words = c.post("/detect", json={"text": SENTENCE}).json()["results"][0]["words"]
        assert [over for _, _, over in shading(browser)] == [
            w["prob"] >= 0.575 and any(ch.isalnum() for ch in w["text"]) for w in words
        ]
        # The status line (a live region) says the answer, not only that one came: a screen reader heard
        # "Scored in 12 ms." and nothing of the words.
        hits = [w["text"] for w in words if w["prob"] >= 0.575 and any(ch.isalnum() for ch in w["text"])]
        counted = sum(any(ch.isalnum() for ch in w["text"]) for w in words)
        said = f"{len(hits)} of {counted} words at or above 0.575" + (
            ": " + ", ".join(hits[:5]) if hits else ""
        )
        status = browser.find_element("id", "status").text
        assert re.fullmatch(r"Scored in (under 1|[1-9]\d*) ms\. (.*)", status).group(2).startswith(said), (
            status
        )
        # The arrow keys still move it by 0.01, onto the grid, and the note names the default exactly; the
        # status line says the count at the slider's threshold (it kept the one scored at, beside a summary
        # of another).
        slider.send_keys(Keys.ARROW_RIGHT)
        assert slider.get_attribute("value") == "0.58" and out.text == "0.58"
        assert "words at or above 0.58" in browser.find_element("id", "status").text
        assert note.text == "(model default 0.575)"
        slider.send_keys(Keys.ARROW_LEFT)
        assert slider.get_attribute("value") == "0.57"
        submit(browser, SENTENCE)
        assert browser.execute_script("return window.__sent.pop()")["threshold"] == 0.57
        # The classifier's 422 goes once the detector is chosen again, and the detector's result is back,
        # marked as another text's (the box was emptied since).
        submit(browser, "", model="sentiment")
        assert "422" in error_shown(browser)[0]
        Select(browser.find_element("id", "model")).select_by_value("detector")
        assert not browser.find_element("id", "error").is_displayed()
        assert browser.find_element("id", "detect").is_displayed()
        assert browser.find_element("css selector", "#detect .stale-note").is_displayed()
        shown = browser.execute_async_script(
            "const done = arguments[0]; import('./ui/render.js').then((m) => done("
            "[0.9996, 1, 0.0004, 0, 0.5].map(m.pct).concat(['0.420', '12.6'].map(m.took))));"
        )
        assert shown == [">99.9%", "100.0%", "<0.1%", "0.0%", "50.0%", "under 1 ms", "13 ms"]
        # A classifier's bars and status line say them alike (they read "100.0%" and "0.0%").
        said = browser.execute_async_script(
            "const done = arguments[0]; import('./ui/render.js').then((m) => {"
            "  const said = m.renderClassify({problem_type: 'single_label_classification'},"
            "    {label: 'positive', probs: {positive: 0.9996, negative: 0.0004}, truncated: false});"
            "  done([said, ...[...document.querySelectorAll('#bars li .pct')].map((e) => e.textContent)]); });"
        )
        assert said == ["positive, >99.9%.", ">99.9%", "<0.1%"]


def test_overlapping_tokens_leave_no_character_outside_the_shading(browser, server):
    """Tokens only go forward but may overlap (/detect: a Hangul syllable's pieces share its offsets, and
    all take an accent after it). A token reaching past the span before it takes that span on to its end:
    the page left the rest of it as plain text, outside every span."""
    text = "\ud55c\u0301 x"
    open_page(browser, server)
    submit(browser, text)
    wait_visible(browser, "detect")
    browser.find_element("css selector", "input[name=unit][value=tokens]").click()
    assert [s[0] for s in shading(browser)] == ["\ud55c\u0301", "x"]
    # A made-up answer whose second token overlaps the first and goes on past it.
    shown = browser.execute_async_script(
        """const done = arguments[0];
           Promise.all([import('./ui/state.js'), import('./ui/render.js')]).then(([s, r]) => {
             const tok = (text, start, end, prob, word) => ({text, token: text, start, end, prob, word});
             const words = [{text: "ab", start: 0, end: 2, prob: 0.9, tokens: [0, 1]},
                            {text: "cd", start: 3, end: 5, prob: 0.1, tokens: [2]}];
             s.state.detect = {text: "ab cd", cps: [0, 1, 2, 3, 4, 5], result: {
               tokens: [tok("a", 0, 1, 0.2, 0), tok("ab", 0, 2, 0.9, 0), tok("cd", 3, 5, 0.1, 1)], words,
               summary: {max_prob: 0.9, mean_prob: 0.4, replaced_fraction: 0.5, spans: [], num_tokens: 3,
                         num_words: 2, windows: 1}}};
             r.renderDetect();
             done([...document.querySelectorAll('#marked .w')].map((e) => [e.textContent, e.dataset.i])
                  .concat([document.getElementById('marked').textContent]));
           });"""
    )
    assert shown == [["ab", "1"], ["cd", "2"], "ab cd"]


def test_classifier_bars_sum_to_100(browser, server):
    with server.client() as c:
        models = c.get("/models").json()["models"]
    classifier = next(m for m in models if m["kind"] == "classifier")
    text = "a gorgeous, witty, seductive movie"
    open_page(browser, server)
    submit(browser, text, model=classifier["name"])
    wait_visible(browser, "classify")
    with server.client() as c:
        result = c.post("/classify", json={"model": classifier["name"], "text": text}).json()["results"][0]
    rows = browser.execute_script(
        """return [...document.querySelectorAll('#bars li')].map(li => [
             li.querySelector('.label').textContent, li.querySelector('.pct').textContent,
             li.querySelector('.fill').getBoundingClientRect().width,
             li.querySelector('.track').clientWidth]);"""
    )
    assert [r[0] for r in rows][0] == result["label"]
    assert sorted(r[0] for r in rows) == sorted(result["probs"])
    assert abs(sum(float(r[1].rstrip("%")) for r in rows) - 100.0) < 0.05
    assert abs(sum(r[2] / r[3] for r in rows) - 1.0) < 0.02
    for label, shown, _, _ in rows:
        assert abs(float(shown.rstrip("%")) - 100 * result["probs"][label]) <= 0.1
    # The status line (a live region) says the top label, as its bar shows it.
    assert browser.find_element("id", "status").text.endswith(f" {rows[0][0]}, {rows[0][1]}.")
    # It goes with the result when another model is chosen (it stayed beside the detector's empty page),
    # and comes back with it.
    said = browser.find_element("id", "status").text
    detector = next(m["name"] for m in models if m["kind"] == "detector")
    Select(browser.find_element("id", "model")).select_by_value(detector)
    assert browser.find_element("id", "status").text == ""
    Select(browser.find_element("id", "model")).select_by_value(classifier["name"])
    assert browser.find_element("id", "status").text == said


def test_a_cut_text_is_said_for_every_kind_of_classifier(browser, tmp_path):
    """The page said a text was cut to the model's maximum length only for single-label classifiers: a
    multi-label (or regression) model's scores of a text's start read as the whole text's."""
    import shutil

    models = tmp_path / "models"
    shutil.copytree(MODELS / "sentiment", models / "tags")
    manifest = json.loads((models / "tags" / "manifest.json").read_text())
    manifest["problem_type"] = "multi_label_classification"
    (models / "tags" / "manifest.json").write_text(json.dumps(manifest))
    with run_server(models, log_dir=tmp_path) as s:
        open_page(browser, s)
        for text, cut in ((" ".join([SENTENCE] * 60), True), (SENTENCE, False)):
            submit(browser, text, model="tags")
            wait_visible(browser, "classify")
            note = browser.find_element("id", "classify-note").text
            assert note.startswith("Each label is scored on its own"), note
            assert ("cut to the model's maximum length" in note) is cut, note


def test_the_page_starts_on_the_servers_default_model(browser, tmp_path):
    """The page took the default detector, else the first model listed: on a server of classifiers only,
    with --default-classifier naming one, it started on another."""
    models = tmp_path / "models"
    models.mkdir()
    for name in ("mysent", "sentiment"):
        (models / name).symlink_to(MODELS / "sentiment")
    with run_server(models, "--default-classifier", "sentiment", log_dir=tmp_path) as s:
        open_page(browser, s)
        assert (
            Select(browser.find_element("id", "model")).first_selected_option.get_attribute("value")
            == "sentiment"
        )


def test_api_key_is_asked_for_and_kept_in_the_tab(browser, keyed_server):
    assert httpx.get(keyed_server.url + "/").status_code == 200  # the page itself is public
    open_page(browser, keyed_server)
    wait_visible(browser, "key-form")
    assert browser.switch_to.active_element.get_attribute("id") == "key"
    # A first visit is asked for the key, not shown an error (it said "Error 401 ... send `authorization:
    # Bearer KEY`", at the foot of the page).
    assert not browser.find_element("id", "error").is_displayed()
    assert not browser.find_element("id", "key-error").is_displayed()
    key = browser.find_element("id", "key")
    key.send_keys("wrong")
    browser.find_element("id", "key-use").click()
    # A refused key is said under the box it was typed in, which is marked invalid and keeps the focus.
    wait_visible(browser, "key-error")
    assert "refused this key" in browser.find_element("id", "key-error").text
    assert key.get_attribute("aria-invalid") == "true"
    assert browser.switch_to.active_element.get_attribute("id") == "key"
    assert not browser.find_element("id", "error").is_displayed()
    # A character no HTTP header carries: the page says so (it blamed the network, as fetch refused it).
    key.clear()
    key.send_keys("s€cret")
    browser.find_element("id", "key-use").click()
    WebDriverWait(browser, WAIT_S).until(
        lambda d: "printable ASCII" in d.find_element("id", "key-error").text
    )
    assert not browser.find_element("id", "error").is_displayed()
    key.clear()
    key.send_keys(KEY)
    browser.find_element("id", "key-use").click()
    WebDriverWait(browser, WAIT_S).until(lambda d: not d.find_element("id", "key-form").is_displayed())
    assert key.get_attribute("aria-invalid") is None
    # With the key, as without: the slider at the detector's own threshold (it stayed at 0.50).
    with keyed_server.client() as c:
        detector = next(
            m for m in c.get("/models").json()["models"] if m["kind"] == "detector" and m["default"]
        )
    assert float(browser.find_element("id", "threshold").get_attribute("value")) == pytest.approx(
        detector["threshold"]
    )
    submit(browser, SENTENCE)
    wait_visible(browser, "detect")
    stored = browser.execute_script(
        "return JSON.stringify(localStorage) + JSON.stringify(sessionStorage) + document.cookie"
    )
    assert KEY not in stored


def answer_next_request(driver, status: int, body: str, media_type: str = "application/json") -> None:
    """The page's next request is answered so, in the page, without reaching the server."""
    driver.execute_script(
        "const f = window.fetch; window.fetch = () => { window.fetch = f; return Promise.resolve(new Response("
        "arguments[1], {status: arguments[0], headers: {'content-type': arguments[2]}})); };",
        status,
        body,
        media_type,
    )


def refuse_next_request(driver) -> None:
    """The page's next request is answered 401, as by a server whose key was changed: the key form opens."""
    error = {"type": "unauthorized", "message": "wrong API key", "field": "authorization"}
    answer_next_request(driver, 401, json.dumps({"error": error}))


def test_a_key_given_again_keeps_the_model_and_the_threshold(browser, server):
    """The key given again (the server refused the one in use) loaded the list again and chose the default
    detector: the classifier the user had chosen, and its result, were gone; a detector's slider went back
    to its own threshold."""
    open_page(browser, server)
    submit(browser, "a gorgeous, witty, seductive movie", "sentiment")
    wait_visible(browser, "classify")
    for model in ("sentiment", "detector"):
        Select(browser.find_element("id", "model")).select_by_value(model)
        if model == "detector":  # the slider moved by the user, as by its arrow keys
            browser.execute_script(
                "const t = document.getElementById('threshold'); t.value = '0.9';"
                "t.dispatchEvent(new Event('input'));"
            )
        refuse_next_request(browser)
        browser.find_element("id", "run").click()
        wait_visible(browser, "key-form")
        browser.find_element("id", "key").send_keys("another key", Keys.ENTER)
        WebDriverWait(browser, WAIT_S).until(lambda d: not d.find_element("id", "key-form").is_displayed())
        assert (
            Select(browser.find_element("id", "model")).first_selected_option.get_attribute("value") == model
        )
    assert browser.find_element("id", "threshold").get_attribute("value") == "0.9"
    Select(browser.find_element("id", "model")).select_by_value("sentiment")
    assert browser.find_element("id", "classify").is_displayed()  # its result, kept with it


def test_a_bundles_warnings_are_shown_beside_its_name(browser, tmp_path):
    """The export's warnings (a detector near chance, a threshold that misses its rule) were in /models
    only: the page showed such a model as it shows a good one."""
    import shutil

    bundle = tmp_path / "models" / "weak"
    shutil.copytree(MODELS / "detector", bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["warnings"] = ["the detector barely tells swapped words from the rest (ROC AUC 0.52)."]
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    # Beside it a bundle that does not load: it is not in the list, and the page says so and why.
    shutil.copytree(MODELS / "sentiment", tmp_path / "models" / "sentiment")
    (tmp_path / "models" / "sentiment" / "tokenizer.json").write_text("{}")
    with run_server(bundle.parent, log_dir=tmp_path) as weak:
        open_page(browser, weak)
        shown = browser.find_element("id", "model-warnings")
        assert shown.is_displayed() and "ROC AUC 0.52" in shown.text, shown.text
        broken = browser.find_element("id", "broken-models")
        assert broken.is_displayed() and "Not served: sentiment (" in broken.text, broken.text
    assert "weak: the detector barely tells swapped words" in weak.log()  # and the server's log, by name


def error_shown(driver) -> tuple[str, str, str]:
    """(heading, the server's message, the page's advice) of the error on screen, once one is."""
    wait_visible(driver, "error")
    box = driver.find_element("id", "error")
    advice = box.find_elements("css selector", ".advice")
    return (
        box.find_element("css selector", "strong").text,
        box.find_element("css selector", ".message").text,
        advice[0].text if advice else "",
    )


def test_refusals_say_what_to_do_and_the_page_goes_on(browser, tmp_path):
    """Each refusal shows the server's message and, for the person at the page, what to do (the server's
    own advice is an operator's: "split it or raise the limit (--max-text-tokens)"); a 429's Retry-After
    is said; the next good text is scored and the error goes."""
    poison = "church"  # one token of the shipped vocabulary: a batch holding it fails (--inject-faults)
    flags = ("--max-text-tokens", "64", "--queue-size", "1", "--runners", "1", "--solo-threads", "1",
             "--max-wait-ms", "2000", "--inject-faults", f"poison={poison}")  # fmt: skip
    with run_server(MODELS, *flags, log_dir=tmp_path) as strict:
        open_page(browser, strict)
        browser.set_window_size(390, 640)  # a phone: the box below the text box starts out of sight
        submit(browser, "word " * 100)
        head, message, todo = error_shown(browser)
        assert "413" in head and "64" in message and todo.startswith("Shorten the text")
        top, bottom, height = browser.execute_script(
            "const r = document.getElementById('error').getBoundingClientRect();"
            "return [r.top, r.bottom, window.innerHeight];"
        )
        assert top >= 0 and bottom <= height + 1, (top, bottom, height)
        browser.set_window_size(1280, 900)
        submit(browser, " \u200b ")
        head, _, todo = error_shown(browser)
        assert "422" in head and "into the text box" in todo
        submit(browser, f"The {poison} bell rang.")
        head, message, todo = error_shown(browser)
        assert "500" in head and "inference_failed" in head and todo.startswith("Press Check to try again")
        # A full queue: one request waits there (--max-wait-ms) while the page asks.
        with strict.client() as c, ThreadPoolExecutor(1) as pool:
            held = pool.submit(c.post, "/detect", json={"text": SENTENCE})
            wait_for(
                lambda: strict.metric("electra_queue_depth", model="detector") == 1, what="a queued request"
            )
            submit(browser, SENTENCE)
            head, _, todo = error_shown(browser)
            assert "429" in head and todo == "The server is busy: press Check again in 1 s."
            assert held.result().status_code == 200
        submit(browser, SENTENCE)
        wait_visible(browser, "detect")
        assert not browser.find_element("id", "error").is_displayed()


def test_a_slider_moved_while_a_check_scores_stays_where_the_user_put_it(browser, tmp_path):
    """The page follows a re-exported detector's threshold from the answer (the test below), but not over
    a slider the user moved while that Check was under way: it jumped back to the server's default."""
    import shutil

    port, models = free_port(), tmp_path / "models"
    shutil.copytree(MODELS / "detector", models / "detector")
    for run in ("first", "again"):  # the same port, so a log folder each
        (tmp_path / run).mkdir()
    with run_server(models, log_dir=tmp_path / "first", port=port) as first:
        open_page(browser, first)
        submit(browser, SENTENCE)
        wait_visible(browser, "detect")  # the slider is shown with a detector's result
    manifest = json.loads((models / "detector" / "manifest.json").read_text())
    manifest["threshold"] = 0.05
    (models / "detector" / "manifest.json").write_text(json.dumps(manifest))
    with run_server(models, log_dir=tmp_path / "again", port=port) as again:
        hold_requests(browser)
        browser.find_element("id", "run").click()
        slider = browser.find_element("id", "threshold")
        slider.send_keys(Keys.ARROW_RIGHT, Keys.ARROW_RIGHT, Keys.ARROW_RIGHT)
        moved = slider.get_attribute("value")
        assert float(moved) > 0.05
        browser.execute_script("document.getElementById('status').textContent = 'waiting';")
        release_requests(browser, 1)
        WebDriverWait(browser, WAIT_S).until(
            lambda d: d.find_element("id", "status").text.startswith("Scored")
        )
        assert slider.get_attribute("value") == moved
        # Its note names the model's new default, and the marks are the API's at the user's threshold.
        assert (
            browser.find_element("id", "threshold-note")
            .get_attribute("textContent")
            .endswith("(model default 0.05)")
        )
        spans = [s["text"] for s in api_detect(again, SENTENCE, float(moved))["summary"]["spans"]]
        assert [text for text, _, over in shading(browser) if over] == spans


def test_a_stopped_server_is_said_and_the_page_goes_on_when_it_is_back(browser, tmp_path):
    import shutil

    port = free_port()
    for run in ("first", "again"):  # the same port, so a log folder each
        (tmp_path / run).mkdir()
    # Back with the detector exported again at another threshold: the page takes it from the answer (it
    # kept the old one, and underlined other words than the API's spans).
    shutil.copytree(MODELS / "detector", tmp_path / "reexported" / "detector")
    manifest = json.loads((tmp_path / "reexported" / "detector" / "manifest.json").read_text())
    manifest["threshold"] = 0.05
    (tmp_path / "reexported" / "detector" / "manifest.json").write_text(json.dumps(manifest))
    with run_server(MODELS, log_dir=tmp_path / "first", port=port) as first:
        open_page(browser, first)
    submit(browser, SENTENCE)
    head, message, todo = error_shown(browser)
    assert message.startswith(f"Could not reach the server at 127.0.0.1:{port}")
    assert todo.startswith("Check that the server is running")
    with run_server(tmp_path / "reexported", log_dir=tmp_path / "again", port=port) as again:
        # Stopped, the server takes the request and never answers: the status says so, then the page gives
        # up once its time limit is past (the page's timers run 60 times faster here). It said "Scoring…"
        # for ever, and Check did nothing.
        browser.execute_script(
            "const st = window.setTimeout; window.setTimeout = (f, ms, ...a) => st(f, ms / 60, ...a);"
        )
        again.proc.send_signal(signal.SIGSTOP)
        try:
            browser.find_element("id", "run").click()
            WebDriverWait(browser, WAIT_S, poll_frequency=0.05).until(
                lambda d: d.find_element("id", "status").text.startswith("Still waiting for the server")
            )
            _, message, todo = error_shown(browser)
        finally:
            again.proc.send_signal(signal.SIGCONT)
        assert (
            message == "The server did not answer in 120 s." and "press Check to send the text again" in todo
        )
        assert browser.find_element("id", "status").text == ""
        submit(browser, SENTENCE)
        wait_visible(browser, "detect")
        assert not browser.find_element("id", "error").is_displayed()
        assert browser.find_element("id", "threshold").get_attribute("value") == "0.05"
        assert (
            browser.find_element("id", "threshold-note")
            .get_attribute("textContent")
            .startswith("model default")
        )
        spans = [s["text"] for s in api_detect(again, SENTENCE, 0.05)["summary"]["spans"]]
        assert [text for text, _, over in shading(browser) if over] == spans
    # Started again without the detector the page had chosen: the 404 brings the list of models up to date
    # (it kept offering the detector, refused at every Check).
    (tmp_path / "sentiment-only").mkdir()
    shutil.copytree(MODELS / "sentiment", tmp_path / "classifier-only" / "sentiment")
    with run_server(tmp_path / "classifier-only", log_dir=tmp_path / "sentiment-only", port=port):
        submit(browser, SENTENCE)
        head, _, todo = error_shown(browser)
        assert "404" in head and "unknown_model" in head and "models have changed" in todo
        model = Select(browser.find_element("id", "model"))
        assert [o.get_attribute("value") for o in model.options] == ["sentiment"]
        submit(browser, "a gorgeous, witty, seductive movie")
        wait_visible(browser, "classify")
        assert not browser.find_element("id", "error").is_displayed()


def test_a_model_the_server_found_broken_is_said_so_not_busy(browser, tmp_path):
    """Started again with the page's model broken (its model.onnx damaged): the 503 is not a busy server,
    so the page does not say to wait; it names the model unusable and brings its list up to date."""
    import shutil

    port, models = free_port(), tmp_path / "models"
    for run in ("first", "again"):
        (tmp_path / run).mkdir()
    shutil.copytree(MODELS, models)
    with run_server(models, log_dir=tmp_path / "first", port=port) as first:
        open_page(browser, first)
    onnx = models / "detector" / "model.onnx"
    onnx.write_bytes(onnx.read_bytes()[:-64] + bytes(64))  # its sha256 no longer the manifest's
    with run_server(models, log_dir=tmp_path / "again", port=port):
        submit(browser, SENTENCE)
        head, message, todo = error_shown(browser)
        assert "503" in head and "is broken" in message and "Pick another" in todo, (head, message, todo)
        assert "busy" not in todo
        model = Select(browser.find_element("id", "model"))
        assert [o.get_attribute("value") for o in model.options] == ["sentiment"]
        assert "detector" in browser.find_element("id", "broken-models").text


def test_a_page_whose_models_did_not_load_loads_them_at_check(browser, server):
    """The list of models failed to load (the server unreachable for that one request): the select said
    "loading…" for ever and Check did nothing, with no word; now Check loads the list and scores. The
    browser's own request blocking stands for the network: the server cannot fail /models alone."""
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/models"]})
    try:
        browser.get(server.url + "/")
        _, message, todo = error_shown(browser)
    finally:
        browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
        browser.execute_cdp_cmd("Network.disable", {})
    assert message.startswith("Could not reach the server") and "press Check to try again" in todo
    model = browser.find_element("id", "model")
    assert not model.is_enabled() and model.text == "not loaded"
    submit(browser, SENTENCE)
    wait_visible(browser, "detect")
    assert model.is_enabled() and not browser.find_element("id", "error").is_displayed()
    with server.client() as c:
        detector = next(m for m in c.get("/models").json()["models"] if m["kind"] == "detector")
    assert float(browser.find_element("id", "threshold").get_attribute("value")) == pytest.approx(
        detector["threshold"]
    )


def test_a_script_that_did_not_load_is_said(browser, server):
    """One of the page's modules failed to load (a --limit-concurrency 503, a dropped connection): no script
    ran, the list said "loading…" for ever, and Check did nothing (the CSP blocks the form's own submit),
    with no word. A note in the page says so, hidden by ui.css for its first seconds and removed by main.js
    once it runs. Blocked by the browser, as the network would."""
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/ui/render.js"]})
    try:
        browser.get(server.url + "/")
        note = browser.find_element("id", "load-failed")
        # Its delay, not waited for: held hidden for the first seconds, then shown.
        assert browser.execute_script("return arguments[0].getAnimations()[0].effect.getTiming().delay", note)
        browser.execute_script("arguments[0].getAnimations().forEach((a) => a.finish())", note)
        assert note.is_displayed() and "scripts have not loaded" in note.text and "reload" in note.text
        assert browser.find_element("id", "model").text == "loading…"
    finally:
        browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
        browser.execute_cdp_cmd("Network.disable", {})
    open_page(browser, server)
    assert not browser.find_elements("id", "load-failed")


def test_a_model_fine_tuned_on_pairs_gets_a_second_text(browser, tmp_path):
    """/classify refused the page's single text for a model fine-tuned on pairs (422 "send `pairs`"): the
    page could not use such a model at all. It now shows a second text box for it, and sends the pair; for
    a model whose training is not recorded (an import takes either) the box is optional."""
    import shutil

    models = tmp_path / "models"
    for name in ("detector", "sentiment"):
        shutil.copytree(MODELS / name, models / name)
    # The shipped classifier, as if fine-tuned on pairs: /models' trained_on reads the recipe's pair column.
    shutil.copytree(MODELS / "sentiment", models / "entailment")
    manifest = json.loads((models / "entailment" / "manifest.json").read_text())
    manifest["source"]["training"]["config"]["text_pair_column"] = "hypothesis"
    (models / "entailment" / "manifest.json").write_text(json.dumps(manifest))
    shutil.copytree(MODELS / "sentiment", models / "imported")
    manifest = json.loads((models / "imported" / "manifest.json").read_text())
    del manifest["source"]["training"]
    (models / "imported" / "manifest.json").write_text(json.dumps(manifest))
    first, second = "A man plays football in a park.", "A man is outside."
    with run_server(models, log_dir=tmp_path) as s:
        with s.client() as c:
            trained_on = {m["name"]: m["trained_on"] for m in c.get("/models").json()["models"]}
            assert trained_on == {
                "detector": None,
                "entailment": "pairs",
                "imported": None,
                "sentiment": "texts",
            }
            result = c.post("/classify", json={"model": "entailment", "pairs": [[first, second]]}).json()
            alone = c.post("/classify", json={"model": "imported", "text": first}).json()
        open_page(browser, s)
        Select(browser.find_element("id", "model")).select_by_value("sentiment")
        assert not browser.find_element("id", "pair-box").is_displayed()
        assert browser.find_element("id", "text-label").text == "Text"
        Select(browser.find_element("id", "model")).select_by_value("entailment")
        pair = browser.find_element("id", "text-pair")
        assert pair.is_displayed() and pair.get_attribute("aria-required") == "true"
        assert browser.find_element("id", "text-label").text == "First text"
        assert "pairs of texts" in browser.find_element("id", "pair-help").text
        pair.send_keys(second)
        submit(browser, first)
        wait_visible(browser, "classify")
        shown = browser.execute_script(
            "return [...document.querySelectorAll('#bars li')].map(li => "
            "[li.querySelector('.label').textContent, li.querySelector('.pct').textContent]);"
        )
        probs = result["results"][0]["probs"]
        assert [label for label, _ in shown] == sorted(probs, key=probs.get, reverse=True)
        for label, pct_text in shown:
            assert abs(float(pct_text.rstrip("%")) - 100 * probs[label]) <= 0.1
        # An edited second text makes the result out of date, as an edited first text does, and so does
        # one edited while the pair is scored.
        stale = browser.find_element("css selector", "#classify .stale-note")
        assert not stale.is_displayed()
        pair.send_keys(" Indeed.")
        assert stale.is_displayed()
        hold_requests(browser)
        browser.find_element("id", "run").click()
        pair.send_keys(" Yes.")
        release_requests(browser, 1)
        WebDriverWait(browser, WAIT_S).until(
            lambda d: d.find_element("id", "status").text.startswith("Scored")
        )
        assert stale.is_displayed()
        # An empty second text: the advice names the box to fill in.
        pair.clear()
        submit(browser, first)
        head, _, todo = error_shown(browser)
        assert "422" in head and "second text box" in todo
        # An empty first text: the box labelled "First text" (the advice said "the text box").
        submit(browser, "")
        head, _, todo = error_shown(browser)
        assert "422" in head and "into the first text box" in todo
        # A model that takes either: the second text is optional, and left empty the text goes alone.
        Select(browser.find_element("id", "model")).select_by_value("imported")
        assert pair.is_displayed() and pair.get_attribute("aria-required") == "false"
        assert browser.find_element("id", "pair-help").text.startswith("Optional")
        submit(browser, first)
        wait_visible(browser, "classify")
        top = alone["results"][0]["label"]
        assert browser.find_element("css selector", "#bars li.top .label").text == top


def test_keyboard_check_keeps_the_focus_and_reaches_the_table(browser, server):
    """Enter on Check left the focus on <body> (the button was disabled while scoring); the table's box,
    which scrolls, is reached with Tab; the shaded text is not described by a word's tooltip as a whole."""
    open_page(browser, server)
    box = browser.find_element("id", "text")
    box.clear()
    box.send_keys(SENTENCE, Keys.TAB)
    assert browser.switch_to.active_element.get_attribute("id") == "run"
    browser.execute_script("document.getElementById('status').textContent = 'waiting';")
    browser.switch_to.active_element.send_keys(Keys.ENTER)
    WebDriverWait(browser, WAIT_S).until(lambda d: d.find_element("id", "status").text.startswith("Scored"))
    assert browser.switch_to.active_element.get_attribute("id") == "run"
    assert browser.find_element("id", "marked").get_attribute("aria-describedby") is None
    browser.find_element("css selector", "input[name=view][value=table]").click()
    browser.switch_to.active_element.send_keys(Keys.TAB)
    table = browser.switch_to.active_element
    assert table.get_attribute("id") == "table-view" and table.get_attribute("role") == "region"
    assert browser.find_element("id", table.get_attribute("aria-labelledby")).text.startswith("Sorted by")
    browser.find_element("css selector", "input[name=view][value=text]").click()


def test_phone_width_and_screenshots(browser, server, tmp_path):
    """The README's pictures show the page as a user first meets it: at the detector's own threshold,
    with the words /detect puts in `spans` underlined, on a desktop and on a phone."""
    out = Path(os.environ.get("UI_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    text = (
        "The committee will publish its report next banana. After dinner everyone walked down to the "
        "river, where the moon was singing over the water."
    )
    for name, width, height in (("ui-desktop.png", 1280, 900), ("ui-phone.png", 390, 844)):
        open_page(browser, server)
        browser.set_window_size(width, height)
        submit(browser, text)
        wait_visible(browser, "detect")
        default = float(browser.find_element("id", "threshold").get_attribute("value"))
        spans = {s["text"] for s in api_detect(server, text, default)["summary"]["spans"]}
        marked = {t for t, _, is_marked in shading(browser) if is_marked}
        assert marked == spans, f"{name}: underlined {marked}, /detect's spans {spans}"
        # Nothing wider than the window: no sideways scrolling on a phone.
        inner, scroll = browser.execute_script(
            "return [window.innerWidth, document.documentElement.scrollWidth]"
        )
        assert scroll <= inner, f"{name}: page is {scroll}px wide in a {inner}px window"
        full = browser.execute_script("return document.documentElement.scrollHeight")
        browser.set_window_size(width, full + (height - browser.execute_script("return window.innerHeight")))
        # Desktop: the most probable word focused, its tooltip open; phone: nothing focused.
        browser.execute_script(
            """document.activeElement.blur();
               if (arguments[0]) [...document.querySelectorAll('#marked .w')]
                 .sort((a, b) => b.dataset.prob - a.dataset.prob)[0].focus({focusVisible: true});""",
            width > 600,
        )
        assert browser.save_screenshot(str(out / name))
        _as_palette(out / name)


def _as_palette(png: Path) -> None:
    """A 256-colour palette: a page's flat colours lose nothing visible, and the picture takes less than
    half the bytes (the tracked tree must fit a GPU loan's copy: tests/test_repo_size.py)."""
    from PIL import Image

    with Image.open(png) as im:
        rgb = im.convert("RGB")
    # Dithered to the median cut's palette: undithered, the legend's smooth scale came out as a few steps
    # (quantize() dithers only to a palette it is given).
    palette = rgb.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    rgb.quantize(palette=palette, dither=Image.Dither.FLOYDSTEINBERG).save(png, optimize=True)
