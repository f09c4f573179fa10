"""The intro's ten-week plan states measured sizes of the chapters: keep them true.

"Text" is the words of a week's two chapters' markdown cells in thousands, rounded; "Exercises"
is the sum of the times in their exercises' titles (``(★★☆, 30 min)``, ``2 h``); labels in days
or weeks (the GPU projects of chapter 20) are left out, as the page says.
"""
import json
import re
from pathlib import Path

from test_notebook_hygiene import EXERCISE_TITLE  # (one pattern for an exercise's title)

BOOK = Path(__file__).resolve().parents[1] / "book"
WEEK = re.compile(r"^\| (\d+) \| (\d+) [^,|]*, (\d+) [^|]*\| (\d+) \| (\d+) min \|$", re.M)
TIME = re.compile(r"(\d+)\s*(min|h)")


def chapter_size(number: int) -> tuple[int, int]:
    """(words of the markdown cells, minutes of the exercises) of chapter ``number``."""
    (path,) = BOOK.glob(f"{number:02d}_*.ipynb")
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "markdown"]
    markdown = ["".join(c["source"]) for c in cells]
    titles = EXERCISE_TITLE.findall("\n".join(markdown))
    minutes = 0
    for title in titles:
        label = re.search(r"\(([^()]*)\)\s*$", title)
        assert label, f"chapter {number}: exercise title without (difficulty, time): {title}"
        # "15 min" of "(★☆☆, 15 min; objective 2)"
        field = label.group(1).split(";")[0].split(",")[1].strip()
        time = TIME.fullmatch(field)
        if time:
            minutes += int(time.group(1)) * (60 if time.group(2) == "h" else 1)
        else:  # days and weeks are left out; nothing else is
            assert re.search(r"\b(days?|weeks?)\b", field), \
                f"chapter {number}: exercise time {field!r} is not in min, h, days or weeks"
    return sum(len(m.split()) for m in markdown), minutes


def test_the_course_plan_states_the_chapters_sizes():
    weeks = WEEK.findall((BOOK / "intro.md").read_text())
    assert [int(w[0]) for w in weeks] == list(range(1, 11))
    chapters = sorted(int(c) for w in weeks for c in w[1:3])
    assert chapters == list(range(1, 21)), "every chapter once in the plan"
    for week, a, b, text, exercises in weeks:
        (words_a, minutes_a), (words_b, minutes_b) = chapter_size(int(a)), chapter_size(int(b))
        assert (int(text), int(exercises)) == (round((words_a + words_b) / 1000),
                                               minutes_a + minutes_b), f"week {week}"
