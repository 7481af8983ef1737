"""The chat page in a real headless Chromium (Debian's package, driven by selenium): a text question and an image
question stream their steps into the page, with the KB badge, evidence cards and the final answer; a backend error
shows as an error in the chat. Over loopback with the fake StepPolicy (no model). Screenshots go to tmp_path, and to
$KBROUTER_SCREENSHOT_DIR when set (docs/images/ holds the committed ones)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from agent.agent_server import create_agent_app
from retrievers.service import serve_in_thread
from tests.agent.agent_setups import make_setups
from tests.fakes import StepPolicy

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--window-size=1200,1000"]  # fmt: skip

pytestmark = pytest.mark.skipif(
    not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
    reason="needs Debian's chromium and chromium-driver (.ci/run installs them: apt-get install chromium chromium-driver)",
)


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def wait_for(driver, css: str, timeout: float = 20, count: int = 1):  # noqa: ANN001, ANN201
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, css)) >= count)
    return driver.find_elements(By.CSS_SELECTOR, css)


def screenshot(driver, tmp_path: Path, name: str) -> Path:  # noqa: ANN001
    path = tmp_path / name
    driver.save_screenshot(str(path))
    assert path.stat().st_size > 10_000, "the screenshot is (nearly) empty"
    if os.environ.get("KBROUTER_SCREENSHOT_DIR"):
        shutil.copy(path, Path(os.environ["KBROUTER_SCREENSHOT_DIR"]) / name)
    return path


def ask(driver, text: str, image: Path | None = None) -> None:  # noqa: ANN001
    from selenium.webdriver.common.by import By

    if image is not None:
        driver.find_element(By.ID, "image").send_keys(str(image))
        wait_for(driver, "#preview[src^='data:image']")
    driver.find_element(By.ID, "question").send_keys(text)
    driver.find_element(By.ID, "send").click()


def test_a_text_question_streams_steps_kb_badge_evidence_and_answer(browser, tmp_path):
    from selenium.webdriver.common.by import By

    setups, media = make_setups(tmp_path, StepPolicy(delay=0.05))
    with serve_in_thread(create_agent_app(setups, media_roots=[media])) as url:
        browser.get(url + "/")
        wait_for(browser, "#model option", count=2)
        assert [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#kbs label")] == [
            "Text KB", "Table KB", "Image KB", "Clip KB"]  # fmt: skip
        ask(browser, "Which nation won the most gold medals in the table?")
        answer = wait_for(browser, ".final-answer")[0]
        steps = browser.find_elements(By.CSS_SELECTOR, "details.step")
        badges = [b.text for b in browser.find_elements(By.CSS_SELECTOR, ".kb-badge")]
        cards = browser.find_elements(By.CSS_SELECTOR, ".evidence-card")
        tables = browser.find_elements(By.CSS_SELECTOR, ".evidence-card table td")
        # the table KB was chosen (the question says "table"); its card renders rows; step 2 stops
        assert len(steps) == 2 and badges == ["Table KB"]
        assert cards and "score" in cards[0].text and "Norway" in [t.text for t in tables]
        assert "Norway" in answer.text
        assert not browser.find_elements(By.CSS_SELECTOR, ".spinner, .chat-error")
        # a follow-up turn keeps the conversation: the policy sees the first exchange as context
        ask(browser, "And which one came second?")
        wait_for(browser, ".final-answer", count=2)
        assert any("Earlier question" in s for s in setups[0].policy.seen)
        # a clip hit plays from its start time (a media fragment on its signed link)
        browser.find_element(By.ID, "new-chat").click()
        ask(browser, "In which clip does Popeye sing?")
        wait_for(browser, ".final-answer")
        video = wait_for(browser, ".evidence-card video")[0]
        assert video.get_attribute("src").endswith("#t=12.5,20") and "clip 12.5s–20.0s" in browser.page_source
        browser.find_element(By.ID, "new-chat").click()
        ask(browser, "Which nation won the most gold medals in the table?")
        wait_for(browser, ".final-answer")
        screenshot(browser, tmp_path, "agent_page_text.png")


def test_an_image_question_shows_an_image_evidence_card(browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    setups, media = make_setups(tmp_path)
    question_image = tmp_path / "question.png"
    shutil.copy(media / "horses.png", question_image)
    with serve_in_thread(create_agent_app(setups, media_roots=[media])) as url:
        browser.get(url + "/")
        wait_for(browser, "#model option", count=2)
        Select(browser.find_element(By.ID, "model")).select_by_value("kbrouter-vision")
        ask(browser, "Which image shows these horses?", image=question_image)
        wait_for(browser, ".final-answer")
        img = wait_for(browser, ".evidence-card img")[0]
        # the thumbnail really loaded through its signed media link
        assert browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth", img) == 96
        assert [b.text for b in browser.find_elements(By.CSS_SELECTOR, ".kb-badge")] == ["Image KB"]
        assert wait_for(browser, ".user img")  # the question image is in the chat
        retriever = setups[1].kbs["Image KB"].retriever
        sent = retriever.queries[-1].image  # the uploaded image went to the search as the query image, byte for byte
        assert sent is not None and Path(sent).read_bytes() == question_image.read_bytes()
        screenshot(browser, tmp_path, "agent_page_image.png")


def test_a_backend_error_is_a_chat_error_not_a_stuck_spinner(browser, tmp_path):
    from selenium.webdriver.common.by import By

    setups, media = make_setups(tmp_path)
    with serve_in_thread(create_agent_app(setups, media_roots=[media])) as url:
        browser.get(url + "/")
        wait_for(browser, "#model option", count=2)
        ask(browser, "What does this picture show?", image=media / "horses.png")  # text-only model: refused
        error = wait_for(browser, ".chat-error")[0]
        assert "text-only" in error.text
        assert not browser.find_elements(By.CSS_SELECTOR, ".spinner")
        assert browser.find_element(By.ID, "send").is_enabled()
